#include "loom/serve/exclusive_port.h"

#include <httplib.h>
#include <sys/socket.h>

namespace loom::serve {

void listen_exclusively(httplib::Server& server) {
  server.set_socket_options([](socket_t socket) {
    int yes = 1;
    ::setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

}  // namespace loom::serve
