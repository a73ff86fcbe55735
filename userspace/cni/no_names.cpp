// Linked into the static sluice-cni only. OpenSSL's static archives carry
// code paths the plugin never takes — name lookups (BIO_lookup,
// BIO_gethostbyname, reached through the DTLS and socket-BIO objects) and
// loading shared objects (engines, providers from openssl.cnf, which the
// plugin does not read). glibc's versions of these need the node's shared
// libraries at run time (NSS, the dynamic loader) and must never run in a
// static binary; these definitions take their place, so none of glibc's
// name service (NSS) is linked, and a call that should never happen fails
// plainly.
#include <dlfcn.h>
#include <netdb.h>

#include <cerrno>

extern "C" {

int getaddrinfo(const char*, const char*, const struct addrinfo*, struct addrinfo** res) {
  if (res) *res = nullptr;
  return EAI_FAIL;
}

void freeaddrinfo(struct addrinfo*) {}

const char* gai_strerror(int) { return "sluice-cni resolves no names"; }

int getnameinfo(const struct sockaddr*, socklen_t, char*, socklen_t, char*, socklen_t, int) { return EAI_FAIL; }

struct hostent* gethostbyname(const char*) {
  h_errno = NO_RECOVERY;
  return nullptr;
}

void* dlopen(const char*, int) { return nullptr; }

void* dlsym(void*, const char*) { return nullptr; }

int dlclose(void*) { return 0; }

char* dlerror() { return const_cast<char*>("sluice-cni loads no shared objects"); }

int dladdr(const void*, Dl_info*) { return 0; }
}
