// Reads a token shard through llm.c's own DataLoader (llmc/dataloader.h from the llm.c sources in
// the GPU bundle, never from this repository) and prints what it loaded, so that
// bench/cuda/llmc_peer.sh can compare it with the tokens token_shards.py wrote:
//   llmc_shard_check PATTERN B T  ->  "tokens N first a b c last_target z"
// llm.c's loader exits with its own message on a bad magic, version or size.
#include <stdio.h>
#include <stdlib.h>

#include "llmc/dataloader.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s PATTERN B T\n", argv[0]);
    return 2;
  }
  const int B = atoi(argv[2]), T = atoi(argv[3]);
  DataLoader loader;
  dataloader_init(&loader, argv[1], B, T, 0, 1, 0);  // rank 0 of 1, no shuffling: the first B x T + 1 tokens
  dataloader_next_batch(&loader);
  printf("tokens %zu first %d %d %d last_target %d\n", loader.num_tokens, loader.inputs[0], loader.inputs[1],
         loader.inputs[2], loader.targets[B * T - 1]);
  dataloader_free(&loader);
  return 0;
}
