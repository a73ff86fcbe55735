#include "userspace/cni/kube_get.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>

#include "base/fd.h"

namespace sluice::cni {

namespace {

using Clock = std::chrono::steady_clock;

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string sslError(const std::string& what) {
  unsigned long e = ERR_get_error();
  char buf[256] = "";
  if (e) ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return what + (e ? std::string(": ") + buf : std::string());
}

int msLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Waits until @p fd is ready for @p events or the deadline passed.
Status waitFor(int fd, short events, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, msLeft(deadline));
    if (n > 0) return {};
    if (n == 0) return Error::msg("timed out " + what, ETIMEDOUT);
    if (errno != EINTR) return Error::fromErrno(errno, "poll");
  }
}

Result<Fd> connectTo(const ServerAddress& a, Clock::time_point deadline) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family = AF_INET;
  if (auto* v4 = reinterpret_cast<sockaddr_in*>(&ss); ::inet_pton(AF_INET, a.host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(a.port);
    len = sizeof(sockaddr_in);
  } else {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
    if (::inet_pton(AF_INET6, a.host.c_str(), &v6->sin6_addr) != 1)
      return Error::msg("'" + a.host + "' is not an IP address", EINVAL);
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(a.port);
    len = sizeof(sockaddr_in6);
    family = AF_INET6;
  }
  Fd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error::fromErrno(errno, "socket");
  const std::string where = a.host + ":" + std::to_string(a.port);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    if (errno != EINPROGRESS) return Error::fromErrno(errno, "connect to " + where);
    SLUICE_TRY(waitFor(fd.get(), POLLOUT, deadline, "connecting to " + where));
    int err = 0;
    socklen_t l = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &l);
    if (err) return Error::fromErrno(err, "connect to " + where);
  }
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};

Status loadCa(SSL_CTX* ctx, const std::string& pem) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return Error::msg(sslError("BIO_new_mem_buf"), ENOMEM);
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  int added = 0;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    if (X509_STORE_add_cert(store, cert) == 1) added++;
    X509_free(cert);
  }
  ERR_clear_error();  // the end of the PEM data reads as an error
  if (added == 0) return Error::msg("the kubeconfig's CA holds no PEM certificate", EINVAL);
  return {};
}

// Runs one SSL I/O call until it completes, waiting on the socket as it asks.
template <typename F>
Result<int> sslIo(SSL* ssl, int fd, Clock::time_point deadline, const std::string& what, F&& call) {
  for (;;) {
    ERR_clear_error();
    int n = call();
    if (n > 0) return n;
    int e = SSL_get_error(ssl, n);
    if (e == SSL_ERROR_WANT_READ) {
      SLUICE_TRY(waitFor(fd, POLLIN, deadline, what));
    } else if (e == SSL_ERROR_WANT_WRITE) {
      SLUICE_TRY(waitFor(fd, POLLOUT, deadline, what));
    } else if (e == SSL_ERROR_ZERO_RETURN) {
      return 0;
    } else if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
      // The peer closed without close_notify: the end for a Connection:
      // close response, a reset otherwise.
      if (errno == 0 || n == 0) return 0;
      return Error::fromErrno(errno, what);
    } else {
      long verify = SSL_get_verify_result(ssl);
      if (verify != X509_V_OK)
        return Error::msg(what + ": the server's certificate: " + X509_verify_cert_error_string(verify), EPROTO);
      return Error::msg(sslError(what), EPROTO);
    }
  }
}

}  // namespace

Result<ServerAddress> parseServer(const std::string& server) {
  const std::string scheme = "https://";
  if (server.rfind(scheme, 0) != 0) return Error::msg("server '" + server + "' is not https://IP:PORT", EINVAL);
  std::string rest = server.substr(scheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  ServerAddress a;
  std::string port;
  if (!rest.empty() && rest.front() == '[') {
    auto close = rest.find(']');
    if (close == std::string::npos) return Error::msg("server '" + server + "': unclosed '['", EINVAL);
    a.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') return Error::msg("server '" + server + "' is not https://IP:PORT", EINVAL);
      port = rest.substr(close + 2);
    }
  } else {
    auto colon = rest.find(':');
    a.host = rest.substr(0, colon);
    if (colon != std::string::npos) port = rest.substr(colon + 1);
  }
  if (!port.empty()) {
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) == 0 ||
        std::stoi(port) > 65535)
      return Error::msg("server '" + server + "': bad port '" + port + "'", EINVAL);
    a.port = static_cast<uint16_t>(std::stoi(port));
  }
  unsigned char buf[16];
  if (::inet_pton(AF_INET, a.host.c_str(), buf) != 1 && ::inet_pton(AF_INET6, a.host.c_str(), buf) != 1)
    return Error::msg("server '" + server + "': '" + a.host + "' is not an IP address (sluice-cni resolves no names)",
                      EINVAL);
  return a;
}

Result<HttpResponse> parseHttpResponse(const std::string& raw) {
  auto headEnd = raw.find("\r\n\r\n");
  if (headEnd == std::string::npos) return Error::msg("HTTP response without the end of its headers", EPROTO);
  HttpResponse r;
  auto lineEnd = raw.find("\r\n");
  std::string status = raw.substr(0, lineEnd);
  unsigned code = 0;
  if (status.rfind("HTTP/1.", 0) != 0 || std::sscanf(status.c_str(), "HTTP/1.%*d %3u", &code) != 1 || code < 100 ||
      code > 599)
    return Error::msg("not an HTTP status line: '" + status.substr(0, 60) + "'", EPROTO);
  r.status = static_cast<int>(code);
  bool chunked = false;
  std::optional<size_t> length;
  size_t pos = lineEnd + 2;
  while (pos < headEnd) {
    auto e = raw.find("\r\n", pos);
    std::string h = raw.substr(pos, e - pos);
    pos = e + 2;
    auto colon = h.find(':');
    if (colon == std::string::npos) continue;
    std::string name = lower(h.substr(0, colon));
    std::string value = h.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    if (name == "transfer-encoding" && lower(value).find("chunked") != std::string::npos) chunked = true;
    if (name == "content-length") {
      if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos)
        return Error::msg("bad Content-Length '" + value + "'", EPROTO);
      length = std::stoull(value);
    }
  }
  std::string body = raw.substr(headEnd + 4);
  if (chunked) {
    size_t p = 0;
    for (;;) {
      auto e = body.find("\r\n", p);
      if (e == std::string::npos) return Error::msg("chunked body cut short", EPROTO);
      size_t n = 0;
      try {
        n = std::stoul(body.substr(p, e - p), nullptr, 16);
      } catch (...) {
        return Error::msg("bad chunk size", EPROTO);
      }
      p = e + 2;
      if (n == 0) break;
      if (body.size() < p + n) return Error::msg("chunked body cut short", EPROTO);
      r.body += body.substr(p, n);
      p += n + 2;
    }
  } else if (length) {
    if (body.size() < *length)
      return Error::msg("body cut short (" + std::to_string(body.size()) + " of " + std::to_string(*length) + " bytes)",
                        EPROTO);
    r.body = body.substr(0, *length);
  } else {
    r.body = std::move(body);
  }
  return r;
}

Result<HttpResponse> httpsGet(const KubeCredentials& creds, const std::string& path, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  auto server = parseServer(creds.server);
  SLUICE_TRY(server);
  // No openssl.cnf: the node's could name providers a static binary cannot
  // load.
  OPENSSL_init_ssl(OPENSSL_INIT_NO_LOAD_CONFIG, nullptr);
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) return Error::msg(sslError("SSL_CTX_new"), ENOMEM);
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  // A server that closes without close_notify after a Connection: close
  // answer (many do) ends the body; its length is checked by
  // parseHttpResponse (Content-Length, chunked).
  SSL_CTX_set_options(ctx.get(), SSL_OP_IGNORE_UNEXPECTED_EOF);
  SLUICE_TRY(loadCa(ctx.get(), creds.caPem));
  auto fd = connectTo(*server, deadline);
  SLUICE_TRY(fd);
  std::unique_ptr<SSL, SslFree> ssl(SSL_new(ctx.get()));
  if (!ssl) return Error::msg(sslError("SSL_new"), ENOMEM);
  // The certificate must name the address we connected to (its IP SAN).
  X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), server->host.c_str());
  SSL_set_fd(ssl.get(), fd->get());
  const std::string where = "the Kubernetes API at " + creds.server;
  SLUICE_TRY(sslIo(ssl.get(), fd->get(), deadline, "TLS handshake with " + where, [&] { return SSL_connect(ssl.get()); }));
  std::string host = server->host.find(':') != std::string::npos ? "[" + server->host + "]" : server->host;
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(server->port) +
                    "\r\nAuthorization: Bearer " + creds.token +
                    "\r\nAccept: application/json\r\nUser-Agent: sluice-cni\r\nConnection: close\r\n\r\n";
  size_t sent = 0;
  while (sent < req.size()) {
    auto n = sslIo(ssl.get(), fd->get(), deadline, "sending to " + where, [&] {
      return SSL_write(ssl.get(), req.data() + sent, static_cast<int>(req.size() - sent));
    });
    SLUICE_TRY(n);
    if (*n == 0) return Error::msg(where + " closed the connection", ECONNRESET);
    sent += static_cast<size_t>(*n);
  }
  std::string raw;
  char buf[16384];
  for (;;) {
    auto n = sslIo(ssl.get(), fd->get(), deadline, "reading from " + where,
                   [&] { return SSL_read(ssl.get(), buf, sizeof(buf)); });
    SLUICE_TRY(n);
    if (*n == 0) break;
    raw.append(buf, static_cast<size_t>(*n));
    if (raw.size() > (8u << 20)) return Error::msg(where + ": answer over 8 MiB", EPROTO);
  }
  return parseHttpResponse(raw);
}

Result<nlohmann::json> kubeGetObject(const KubeCredentials& creds, const std::string& path,
                                     std::chrono::milliseconds timeout) {
  auto r = httpsGet(creds, path, timeout);
  SLUICE_TRY(r);
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (r->status == 200) {
    if (!j.is_object()) return Error::msg("GET " + path + ": the answer is not a JSON object", EPROTO);
    return j;
  }
  std::string why = std::to_string(r->status);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) why += " " + j["message"].get<std::string>();
  int code = r->status == 404 ? ENOENT : (r->status == 401 || r->status == 403) ? EACCES : EIO;
  return Error::msg("GET " + path + ": " + why, code);
}

}  // namespace sluice::cni
