#include "userspace/agent/kube/client.h"

#include <curl/curl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

namespace sluice::kube {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Largest body of a non-watch response and largest single watch event.
constexpr size_t kMaxBody = 256u << 20;
constexpr size_t kMaxEventLine = 64u << 20;

void globalInit() {
  static std::once_flag once;
  // curl_global_init is not thread-safe; the agent calls it once from here.
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// Percent-encoding of a query value or path segment (RFC 3986 unreserved
// characters stay as they are).
std::string escape(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

std::string withQuery(std::string path, const std::vector<std::pair<std::string, std::string>>& params) {
  char sep = path.find('?') == std::string::npos ? '?' : '&';
  for (const auto& [k, v] : params) {
    path += sep;
    path += k + "=" + escape(v);
    sep = '&';
  }
  return path;
}

const char* httpText(long status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

// The first line of a text, at most 200 bytes, for an error message.
std::string oneLine(const std::string& s) {
  std::string line = s.substr(0, s.find_first_of("\r\n"));
  if (line.size() > 200) line = line.substr(0, 200) + "...";
  return line;
}

int curlErrno(CURLcode c) {
  switch (c) {
    case CURLE_OPERATION_TIMEDOUT: return ETIMEDOUT;
    case CURLE_COULDNT_CONNECT: return ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY: return EHOSTUNREACH;
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING: return ECONNRESET;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR: return EPROTO;
    default: return EIO;
  }
}

template <typename T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};
void freeSlist(curl_slist* l) { curl_slist_free_all(l); }
using SlistPtr = std::unique_ptr<curl_slist, Deleter<curl_slist, freeSlist>>;

Result<std::string> readFile(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Error::fromErrno(errno ? errno : EIO, what + " " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Status checkReadable(const std::string& path, const std::string& what) {
  if (::access(path.c_str(), R_OK) != 0) return Error::fromErrno(errno, what + " " + path);
  return {};
}

}  // namespace

const char* toString(WatchEventType t) {
  switch (t) {
    case WatchEventType::Added: return "ADDED";
    case WatchEventType::Modified: return "MODIFIED";
    case WatchEventType::Deleted: return "DELETED";
    case WatchEventType::Bookmark: return "BOOKMARK";
    case WatchEventType::Error: return "ERROR";
  }
  return "?";
}

Error statusError(const json& status, const std::string& context, int httpStatus) {
  int code = httpStatus;
  std::string reason, message;
  if (status.is_object()) {
    if (auto it = status.find("code"); it != status.end() && it->is_number_integer()) code = it->get<int>();
    if (auto it = status.find("reason"); it != status.end() && it->is_string()) reason = it->get<std::string>();
    if (auto it = status.find("message"); it != status.end() && it->is_string()) message = oneLine(it->get<std::string>());
  }
  if (code == 0) code = EIO;
  if (reason.empty()) reason = httpText(code);
  std::string text = context + ": HTTP " + std::to_string(code);
  if (!reason.empty()) text += " " + reason;
  if (!message.empty() && message != reason) text += ": " + message;
  return Error{code, text};
}

Result<ClientConfig> inClusterConfig(const std::string& dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !*host) return Error::msg("in-cluster configuration: KUBERNETES_SERVICE_HOST is not set (not in a pod?)", ENOENT);
  if (!port || !*port) return Error::msg("in-cluster configuration: KUBERNETES_SERVICE_PORT is not set (not in a pod?)", ENOENT);
  std::string h = host;
  // An IPv6 service address needs brackets in a URL.
  if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";
  ClientConfig c;
  c.apiUrl = "https://" + h + ":" + port;
  c.tokenFile = dir + "/token";
  c.caFile = dir + "/ca.crt";
  if (auto s = checkReadable(c.tokenFile, "in-cluster configuration: service account token"); !s) return s.error();
  if (auto s = checkReadable(c.caFile, "in-cluster configuration: service account CA"); !s) return s.error();
  return c;
}

Result<ClientConfig> explicitConfig(const std::string& apiUrl, const std::string& tokenFile, const std::string& caFile) {
  if (apiUrl.rfind("https://", 0) != 0 && apiUrl.rfind("http://", 0) != 0)
    return Error::msg("Kubernetes API URL \"" + apiUrl + "\" is not an http:// or https:// URL", EINVAL);
  ClientConfig c;
  c.apiUrl = apiUrl;
  while (!c.apiUrl.empty() && c.apiUrl.back() == '/') c.apiUrl.pop_back();
  c.tokenFile = tokenFile;
  c.caFile = caFile;
  if (!tokenFile.empty())
    if (auto s = checkReadable(tokenFile, "Kubernetes token file"); !s) return s.error();
  if (!caFile.empty())
    if (auto s = checkReadable(caFile, "Kubernetes CA file"); !s) return s.error();
  return c;
}

std::string podsPath(const std::string& ns) {
  return ns.empty() ? "/api/v1/pods" : "/api/v1/namespaces/" + escape(ns) + "/pods";
}
std::string podPath(const std::string& ns, const std::string& name) { return podsPath(ns) + "/" + escape(name); }
std::string podStatusPath(const std::string& ns, const std::string& name) { return podPath(ns, name) + "/status"; }
std::string namespacesPath() { return "/api/v1/namespaces"; }
std::string namespacePath(const std::string& name) { return namespacesPath() + "/" + escape(name); }
std::string nodePath(const std::string& name) { return "/api/v1/nodes/" + escape(name); }
std::string daemonSetPath(const std::string& ns, const std::string& name) {
  return "/apis/apps/v1/namespaces/" + escape(ns) + "/daemonsets/" + escape(name);
}

// One HTTP exchange and what came back.
struct Client::Request {
  std::string method = "GET";
  std::string path;  ///< with the query
  std::string body;  ///< request body (PATCH)
  std::string contentType;
  bool isWatch = false;
  std::chrono::milliseconds stallTimeout{0};
  const std::function<bool(WatchEvent&&)>* onEvent = nullptr;
  const std::function<void()>* onOpen = nullptr;

  // Filled by the transfer.
  CURL* easy = nullptr;
  std::string response;  ///< body of a non-streamed answer (or an error)
  std::string lineBuf;   ///< watch: bytes of the event line in progress
  Clock::time_point lastData;
  bool handlerStopped = false;
  std::optional<Error> streamError;
  bool tooLarge = false;

  std::string what() const { return (isWatch ? std::string("watch") : method) + " " + path; }
};

namespace {

// Splits the watch stream into lines, one JSON event per line.
bool deliverLines(std::string& buf, const std::function<bool(WatchEvent&&)>& onEvent, std::optional<Error>& err,
                  bool& stopped, const std::string& what) {
  size_t start = 0;
  for (;;) {
    size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    std::string_view line(buf.data() + start, nl - start);
    start = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("type") || !j["type"].is_string() || !j.contains("object")) {
      err = Error::msg(what + ": bad watch event: " + oneLine(std::string(line)), EPROTO);
      return false;
    }
    const std::string type = j["type"];
    WatchEvent ev;
    if (type == "ADDED") ev.type = WatchEventType::Added;
    else if (type == "MODIFIED") ev.type = WatchEventType::Modified;
    else if (type == "DELETED") ev.type = WatchEventType::Deleted;
    else if (type == "BOOKMARK") ev.type = WatchEventType::Bookmark;
    else if (type == "ERROR") ev.type = WatchEventType::Error;
    else {
      err = Error::msg(what + ": unknown watch event type \"" + type + "\"", EPROTO);
      return false;
    }
    ev.object = std::move(j["object"]);
    if (!onEvent(std::move(ev))) {
      stopped = true;
      return false;
    }
  }
  buf.erase(0, start);
  if (buf.size() > kMaxEventLine) {
    err = Error::msg(what + ": watch event larger than " + std::to_string(kMaxEventLine) + " bytes", EMSGSIZE);
    return false;
  }
  return true;
}

}  // namespace

size_t Client::onHeader(char* data, size_t size, size_t n, void* userdata) {
  auto* r = static_cast<Request*>(userdata);
  size_t len = size * n;
  r->lastData = Clock::now();
  // The blank line ends a header block (interim 1xx blocks come first).
  if (r->onOpen && *r->onOpen && (len == 2 && data[0] == '\r' && data[1] == '\n')) {
    long status = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status == 200) (*r->onOpen)();
  }
  return len;
}

size_t Client::onData(char* data, size_t size, size_t n, void* userdata) {
  auto* r = static_cast<Request*>(userdata);
  size_t len = size * n;
  r->lastData = Clock::now();
  long status = 0;
  curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
  if (r->isWatch && status == 200) {
    r->lineBuf.append(data, len);
    if (!deliverLines(r->lineBuf, *r->onEvent, r->streamError, r->handlerStopped, r->what())) return 0;
    return len;
  }
  if (r->response.size() + len > kMaxBody) {
    r->tooLarge = true;
    return 0;
  }
  r->response.append(data, len);
  return len;
}

struct Client::Handle {
  CURLM* multi = nullptr;
  CURL* easy = nullptr;
  ~Handle() {
    if (easy) curl_easy_cleanup(easy);
    if (multi) curl_multi_cleanup(multi);
  }
};

Client::Client(ClientConfig config) : config_(std::move(config)) {}
Client::~Client() = default;

std::unique_ptr<Client::Handle> Client::acquire() {
  {
    std::lock_guard lock(poolMu_);
    if (!pool_.empty()) {
      auto h = std::move(pool_.back());
      pool_.pop_back();
      curl_easy_reset(h->easy);  // options go, the multi's connections stay
      return h;
    }
  }
  auto h = std::make_unique<Handle>();
  h->multi = curl_multi_init();
  h->easy = curl_easy_init();
  if (!h->multi || !h->easy) return nullptr;
  return h;
}

void Client::release(std::unique_ptr<Handle> h) {
  if (!h) return;
  std::lock_guard lock(poolMu_);
  if (pool_.size() < kPoolSize) pool_.push_back(std::move(h));
}

Result<std::unique_ptr<Client>> Client::create(ClientConfig config) {
  globalInit();
  if (config.apiUrl.empty()) return Error::msg("Kubernetes client: no API URL", EINVAL);
  std::unique_ptr<Client> c(new Client(std::move(config)));
  if (!c->config_.tokenFile.empty()) SLUICE_TRY(c->token(true));
  return c;
}

Result<std::string> Client::token(bool forceReload) {
  if (config_.tokenFile.empty()) return std::string();
  std::lock_guard lock(tokenMu_);
  struct stat st {};
  // stat follows the ..data symlink kubelet swaps atomically on rotation, so
  // a new token shows up as another inode (or at least another mtime).
  if (::stat(config_.tokenFile.c_str(), &st) != 0) {
    if (!token_.empty() && !forceReload) return token_;  // keep using the last one
    return Error::fromErrno(errno, "Kubernetes token file " + config_.tokenFile);
  }
  FileStamp stamp{st.st_dev, st.st_ino, st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
                  st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec, st.st_size};
  if (!forceReload && stamp == tokenStamp_ && !token_.empty()) return token_;
  auto content = readFile(config_.tokenFile, "Kubernetes token file");
  if (!content) return content.error();
  std::string t = *content;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t.empty()) return Error::msg("Kubernetes token file " + config_.tokenFile + " is empty", EINVAL);
  if (t.find_first_of("\r\n") != std::string::npos)
    return Error::msg("Kubernetes token file " + config_.tokenFile + " holds more than one line", EINVAL);
  token_ = t;
  tokenStamp_ = stamp;
  return token_;
}

Result<long> Client::perform(Request& req, std::stop_token stop) {
  auto tok = token();
  if (!tok) return Error::msg(req.what() + ": " + tok.error().message, tok.error().code);
  auto status = performOnce(req, *tok, stop);
  if (!status || *status != 401 || config_.tokenFile.empty()) return status;
  // The token may have rotated since it was read: read it again and retry once.
  auto fresh = token(true);
  if (!fresh || *fresh == *tok) return status;
  req.response.clear();
  req.lineBuf.clear();
  return performOnce(req, *fresh, stop);
}

Result<long> Client::performOnce(Request& req, const std::string& tok, std::stop_token stop) {
  auto handle = acquire();
  if (!handle) return Error::msg(req.what() + ": libcurl initialisation failed", ENOMEM);
  // Back to the pool at every return: its multi handle keeps the connection
  // open for the next request (no new TCP and TLS handshake per request).
  struct Release {
    Client* c;
    std::unique_ptr<Handle>& h;
    ~Release() { c->release(std::move(h)); }
  } release{this, handle};
  CURL* e = handle->easy;
  req.easy = e;
  char errbuf[CURL_ERROR_SIZE] = {0};
  const std::string url = config_.apiUrl + req.path;
  SlistPtr headers;
  auto addHeader = [&](const std::string& h) {
    curl_slist* l = curl_slist_append(headers.get(), h.c_str());
    if (l) {
      (void)headers.release();
      headers.reset(l);
    }
  };
  addHeader("Accept: application/json");
  if (!tok.empty()) addHeader("Authorization: Bearer " + tok);
  if (!req.contentType.empty()) addHeader("Content-Type: " + req.contentType);

  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for DNS time-outs
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(e, CURLOPT_USERAGENT, config_.userAgent.c_str());
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(config_.connectTimeout.count()));
  if (!req.isWatch) curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(config_.requestTimeout.count()));
  // A dead peer under a long watch shows up through keep-alive probes.
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPIDLE, 30L);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPINTVL, 10L);
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!config_.caFile.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, config_.caFile.c_str());
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, onData);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &req);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, onHeader);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, &req);
  if (req.method != "GET") {
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req.method.c_str());
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, req.body.c_str());
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, static_cast<long>(req.body.size()));
  }

  // The multi interface lets the transfer be stopped from another thread
  // (curl_multi_wakeup) and a silent stream be noticed (no data for
  // stallTimeout), which a blocking curl_easy_perform offers neither.
  CURLM* m = handle->multi;
  curl_multi_add_handle(m, e);
  std::stop_callback wake(stop, [m] { curl_multi_wakeup(m); });
  req.lastData = Clock::now();
  std::optional<Error> abort;
  int running = 1;
  for (;;) {
    CURLMcode mc = curl_multi_perform(m, &running);
    if (mc != CURLM_OK) {
      abort = Error::msg(req.what() + ": " + curl_multi_strerror(mc), EIO);
      break;
    }
    if (!running) break;
    if (stop.stop_requested()) {
      abort = Error::msg(req.what() + ": cancelled", ECANCELED);
      break;
    }
    if (req.stallTimeout.count() > 0 && Clock::now() - req.lastData > req.stallTimeout) {
      abort = Error::msg(req.what() + ": no data for " + std::to_string(req.stallTimeout.count()) + " ms (stalled stream)",
                         ETIMEDOUT);
      break;
    }
    curl_multi_poll(m, nullptr, 0, 100, nullptr);
  }
  CURLcode result = CURLE_OK;
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(m, &left))
    if (msg->msg == CURLMSG_DONE && msg->easy_handle == e) result = msg->data.result;
  curl_multi_remove_handle(m, e);
  req.easy = nullptr;
  if (abort) return *abort;
  if (req.streamError) return *req.streamError;
  if (req.handlerStopped) return 200L;
  if (req.tooLarge) return Error::msg(req.what() + ": response larger than " + std::to_string(kMaxBody) + " bytes", EMSGSIZE);
  if (result != CURLE_OK) {
    std::string detail = errbuf[0] ? std::string(errbuf) : std::string(curl_easy_strerror(result));
    if (result == CURLE_PARTIAL_FILE || result == CURLE_RECV_ERROR) detail = "connection lost (" + detail + ")";
    return Error::msg(req.what() + ": " + detail, curlErrno(result));
  }
  long status = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  return status;
}

namespace {

// A non-2xx answer as an Error (the Status object when the body is one).
Error httpError(long status, const std::string& body, const std::string& what) {
  json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.value("kind", "") == "Status") {
    Error e = statusError(j, what, static_cast<int>(status));
    e.code = static_cast<int>(status);  // the HTTP status decides, as client-go does
    return e;
  }
  std::string text = what + ": HTTP " + std::to_string(status);
  if (*httpText(status)) text += std::string(" ") + httpText(status);
  if (auto line = oneLine(body); !line.empty()) text += ": " + line;
  return Error{static_cast<int>(status), text};
}

Result<json> parseObject(const std::string& body, const std::string& what) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error::msg(what + ": answer is not a JSON object: " + oneLine(body), EPROTO);
  return j;
}

}  // namespace

Result<json> Client::get(const std::string& path, std::stop_token stop) {
  Request req;
  req.path = path;
  auto status = perform(req, stop);
  if (!status) return status.error();
  if (*status / 100 != 2) return httpError(*status, req.response, req.what());
  return parseObject(req.response, req.what());
}

Result<ListPage> Client::list(const std::string& path, const ListOptions& o, std::stop_token stop) {
  std::vector<std::pair<std::string, std::string>> q;
  if (!o.fieldSelector.empty()) q.emplace_back("fieldSelector", o.fieldSelector);
  if (!o.labelSelector.empty()) q.emplace_back("labelSelector", o.labelSelector);
  if (!o.resourceVersion.empty()) q.emplace_back("resourceVersion", o.resourceVersion);
  if (o.limit > 0) q.emplace_back("limit", std::to_string(o.limit));
  if (!o.continueToken.empty()) q.emplace_back("continue", o.continueToken);
  Request req;
  req.path = withQuery(path, q);
  auto status = perform(req, stop);
  if (!status) return status.error();
  if (*status / 100 != 2) return httpError(*status, req.response, req.what());
  auto j = parseObject(req.response, req.what());
  if (!j) return j.error();
  auto items = j->find("items");
  if (items == j->end() || !(items->is_array() || items->is_null()))
    return Error::msg(req.what() + ": list answer without items", EPROTO);
  ListPage page;
  if (items->is_array()) page.items = std::move(items->get_ref<json::array_t&>());
  const json meta = j->value("metadata", json::object());
  page.resourceVersion = meta.value("resourceVersion", "");
  page.continueToken = meta.value("continue", "");
  return page;
}

Result<WatchEnd> Client::watch(const std::string& path, const WatchOptions& o,
                               const std::function<bool(WatchEvent&&)>& onEvent, std::stop_token stop) {
  std::vector<std::pair<std::string, std::string>> q{{"watch", "1"}};
  if (!o.resourceVersion.empty()) q.emplace_back("resourceVersion", o.resourceVersion);
  if (o.allowBookmarks) q.emplace_back("allowWatchBookmarks", "true");
  if (o.timeout.count() > 0) q.emplace_back("timeoutSeconds", std::to_string(o.timeout.count()));
  if (!o.fieldSelector.empty()) q.emplace_back("fieldSelector", o.fieldSelector);
  if (!o.labelSelector.empty()) q.emplace_back("labelSelector", o.labelSelector);
  Request req;
  req.path = withQuery(path, q);
  req.isWatch = true;
  req.stallTimeout = o.stallTimeout;
  req.onEvent = &onEvent;
  req.onOpen = &o.onOpen;
  auto status = perform(req, stop);
  if (!status) return status.error();
  if (req.handlerStopped) return WatchEnd::Stopped;
  if (*status != 200) return httpError(*status, req.response, req.what());
  if (!req.lineBuf.empty() && req.lineBuf.find_first_not_of(" \t\r\n") != std::string::npos)
    return Error::msg(req.what() + ": stream ended inside an event", ECONNRESET);
  return WatchEnd::Closed;
}

Result<json> Client::mergePatch(const std::string& path, const json& patch, std::stop_token stop) {
  return sendPatch(path, patch, "application/merge-patch+json", stop);
}

Result<json> Client::jsonPatch(const std::string& path, const json& operations, std::stop_token stop) {
  return sendPatch(path, operations, "application/json-patch+json", stop);
}

Result<json> Client::sendPatch(const std::string& path, const json& body, const char* contentType, std::stop_token stop) {
  Request req;
  req.method = "PATCH";
  req.path = path;
  req.body = body.dump();
  req.contentType = contentType;
  auto status = perform(req, stop);
  if (!status) return status.error();
  if (*status / 100 != 2) return httpError(*status, req.response, req.what());
  return parseObject(req.response, req.what());
}

}  // namespace sluice::kube
