#pragma once
// The life cycle of the verbs that serve until stopped (`loom serve`, `loom env serve`, the
// `loom grpo` controller): `serve` blocks until the server stops; SIGTERM and SIGINT only set a
// flag, which a watcher thread turns into `stop()` (a graceful shutdown outside the signal
// handler). SIGPIPE is ignored: a client that hangs up is
// the server's business, not a reason to die.
#include <functional>

namespace loom::cli {

void serve_until_signal(const std::function<void()>& serve, const std::function<void()>& stop);

}  // namespace loom::cli
