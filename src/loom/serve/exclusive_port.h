#pragma once
// cpp-httplib sets SO_REUSEPORT on a server's listening socket, which lets a second server bind a
// port a live one listens on, the kernel then splitting the connections between them: `loom
// serve --port P` started twice would run twice, a restarted role on a fixed port could share it
// with its predecessor still shutting down. loom's servers set SO_REUSEADDR alone: a port another
// socket listens on is refused, one left in TIME_WAIT by a server that ended is not.
namespace httplib {
class Server;
}

namespace loom::serve {

void listen_exclusively(httplib::Server& server);

}  // namespace loom::serve
