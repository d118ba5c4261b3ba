#pragma once
// cpp-httplib sets SO_REUSEPORT on a server's listening socket, which lets a second server bind a
// port a live one listens on: the kernel then splits the connections between them, and a bind to
// port 0 may even hand out such a port. A restarted GRPO role could so share the port of its
// predecessor still shutting down (requests reaching the old weights), and `loom serve --port P`
// started twice would run twice. loom's servers set SO_REUSEADDR alone: a port another socket
// listens on is refused, one left in TIME_WAIT by a server that ended is not.
namespace httplib {
class Server;
}

namespace loom::serve {

void listen_exclusively(httplib::Server& server);

}  // namespace loom::serve
