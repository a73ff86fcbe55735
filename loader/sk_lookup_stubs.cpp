#include "loader/sk_lookup_stubs.h"

#include <bpf/bpf.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <linux/bpf.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <utility>

namespace sluice {

namespace {

bpf_insn insn(__u8 code, __u8 dst, __u8 src, __s16 off, __s32 imm) {
  return bpf_insn{.code = code, .dst_reg = dst, .src_reg = src, .off = off, .imm = imm};
}

}  // namespace

// "I am the pod my array names", then the shared program. Any miss — the
// array unreadable, its cookie still 0, the scratch missing — and the
// lookup is dropped; so is it when slot 0 of sk_lookup_prog is empty (the
// tail call falls through).
Result<SkLookupStub> loadSkLookupStub(int scratchFd, int progsFd) {
  LIBBPF_OPTS(bpf_map_create_opts, mopts, .map_flags = BPF_F_RDONLY_PROG);
  Fd cookie(bpf_map_create(BPF_MAP_TYPE_ARRAY, kSkLookupStubName, sizeof(__u32), sizeof(__u64), 1, &mopts));
  if (!cookie.valid()) return Error::fromErrno(errno, "create the pod's sk_lookup cookie array");
  const __u8 ld = BPF_LD | BPF_DW | BPF_IMM, call = BPF_JMP | BPF_CALL;
  const __u8 mov = BPF_ALU64 | BPF_MOV | BPF_X, jeq0 = BPF_JMP | BPF_JEQ | BPF_K;
  const bpf_insn insns[] = {
      /* 0 */ insn(mov, BPF_REG_6, BPF_REG_1, 0, 0),
      /* 1 */ insn(BPF_ST | BPF_MEM | BPF_W, BPF_REG_10, 0, -4, 0),
      /* 2 */ insn(ld, BPF_REG_1, BPF_PSEUDO_MAP_FD, 0, cookie.get()),
      /* 3 */ insn(0, 0, 0, 0, 0),
      /* 4 */ insn(mov, BPF_REG_2, BPF_REG_10, 0, 0),
      /* 5 */ insn(BPF_ALU64 | BPF_ADD | BPF_K, BPF_REG_2, 0, 0, -4),
      /* 6 */ insn(call, 0, 0, 0, BPF_FUNC_map_lookup_elem),
      /* 7 */ insn(jeq0, BPF_REG_0, 0, 14, 0),
      /* 8 */ insn(BPF_LDX | BPF_MEM | BPF_DW, BPF_REG_7, BPF_REG_0, 0, 0),
      /* 9 */ insn(jeq0, BPF_REG_7, 0, 12, 0),
      /* 10 */ insn(ld, BPF_REG_1, BPF_PSEUDO_MAP_FD, 0, scratchFd),
      /* 11 */ insn(0, 0, 0, 0, 0),
      /* 12 */ insn(mov, BPF_REG_2, BPF_REG_10, 0, 0),
      /* 13 */ insn(BPF_ALU64 | BPF_ADD | BPF_K, BPF_REG_2, 0, 0, -4),
      /* 14 */ insn(call, 0, 0, 0, BPF_FUNC_map_lookup_elem),
      /* 15 */ insn(jeq0, BPF_REG_0, 0, 6, 0),
      /* 16 */ insn(BPF_STX | BPF_MEM | BPF_DW, BPF_REG_0, BPF_REG_7, 0, 0),
      /* 17 */ insn(mov, BPF_REG_1, BPF_REG_6, 0, 0),
      /* 18 */ insn(ld, BPF_REG_2, BPF_PSEUDO_MAP_FD, 0, progsFd),
      /* 19 */ insn(0, 0, 0, 0, 0),
      /* 20 */ insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_3, 0, 0, 0),
      /* 21 */ insn(call, 0, 0, 0, BPF_FUNC_tail_call),
      /* 22 */ insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0 /* SK_DROP */),
      /* 23 */ insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
  };
  LIBBPF_OPTS(bpf_prog_load_opts, opts, .expected_attach_type = BPF_SK_LOOKUP);
  Fd prog(bpf_prog_load(BPF_PROG_TYPE_SK_LOOKUP, kSkLookupStubName, "Dual BSD/GPL", insns, sizeof(insns) / sizeof(insns[0]),
                        &opts));
  if (!prog.valid()) return Error::fromErrno(errno, "load the pod's sk_lookup program");
  return SkLookupStub{std::move(prog), std::move(cookie)};
}

Status nameSkLookupStub(const SkLookupStub& stub, uint64_t netnsCookie) {
  const __u32 zero = 0;
  const __u64 value = netnsCookie;
  if (bpf_map_update_elem(stub.cookie.get(), &zero, &value, BPF_ANY) != 0)
    return Error::fromErrno(errno, "write the pod's sk_lookup cookie");
  if (bpf_map_freeze(stub.cookie.get()) != 0) return Error::fromErrno(errno, "freeze the pod's sk_lookup cookie");
  return {};
}

Result<std::unique_ptr<SkLookupStubPool>> SkLookupStubPool::start(int scratchFd, int progsFd, size_t depth) {
  Fd scratch(::fcntl(scratchFd, F_DUPFD_CLOEXEC, 0));
  if (!scratch.valid()) return Error::fromErrno(errno, "dup sk_lookup_pod");
  Fd progs(::fcntl(progsFd, F_DUPFD_CLOEXEC, 0));
  if (!progs.valid()) return Error::fromErrno(errno, "dup sk_lookup_prog");
  std::unique_ptr<SkLookupStubPool> pool(new SkLookupStubPool(std::move(scratch), std::move(progs), depth));
  pool->thread_ = std::thread([p = pool.get()] { p->run(); });
  return pool;
}

SkLookupStubPool::SkLookupStubPool(Fd scratch, Fd progs, size_t depth)
    : scratch_(std::move(scratch)), progs_(std::move(progs)), depth_(depth) {}

SkLookupStubPool::~SkLookupStubPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SkLookupStubPool::run() {
  // Background work in the strict sense: a refill woken by take() must not
  // preempt the enrollment that took the stub (on a busy node it would run
  // its ~0.5 ms load on that very CPU first). SCHED_IDLE runs only on a CPU
  // with nothing else to do; should the node never idle, the pool drains
  // and enrollments load their own.
  const sched_param idle{};
  (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [this] { return stop_ || (!paused_ && ready_.size() < depth_); });
    if (stop_) return;
    l.unlock();
    auto stub = loadSkLookupStub(scratch_.get(), progs_.get());
    l.lock();
    if (stub.ok()) {
      ready_.push_back(std::move(*stub));
    } else {
      counts_.loadErrors++;
      paused_ = true;
    }
    cv_.notify_all();
  }
}

Result<Fd> SkLookupStubPool::take(uint64_t netnsCookie) {
  std::optional<SkLookupStub> stub;
  {
    std::lock_guard<std::mutex> l(mu_);
    paused_ = false;
    if (!ready_.empty()) {
      stub = std::move(ready_.front());
      ready_.pop_front();
      counts_.ahead++;
    } else {
      counts_.inline_++;
    }
  }
  cv_.notify_all();
  if (!stub) {
    auto now = loadSkLookupStub(scratch_.get(), progs_.get());
    SLUICE_TRY(now);
    stub = std::move(*now);
  }
  SLUICE_TRY(nameSkLookupStub(*stub, netnsCookie));
  return std::move(stub->prog);
}

size_t SkLookupStubPool::ready() const {
  std::lock_guard<std::mutex> l(mu_);
  return ready_.size();
}

SkLookupStubPool::Counts SkLookupStubPool::counts() const {
  std::lock_guard<std::mutex> l(mu_);
  return counts_;
}

bool SkLookupStubPool::waitReady(size_t n, int timeoutMs) const {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_for(l, std::chrono::milliseconds(timeoutMs), [&] { return ready_.size() >= n || paused_; }) &&
         ready_.size() >= n;
}

}  // namespace sluice
