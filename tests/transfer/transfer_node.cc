// One side of a multi-process transfer test, as a sidecar would run it: a real UCX transport,
// the data-plane handshake, and (prefill) the scheduler moving planned rooms.
//
//   transfer_node decode --arena /name --tls tcp --bind 127.0.0.1
//       maps the arena, registers it, serves the handshake; prints "session <id>"; exits 0
//       when stdin closes.
//   transfer_node decode --allocate-bytes N --tls sm ...
//   --tls verbs: the verbs backend over the software provider (softverbs), its rail on
//       --net-devices (default lo).
//       the arena is the transport's own (Transport::Allocate, as a sidecar gives its engine):
//       prints "arena pid=<pid> fd=<fd> offset=<offset> placement=<placement>" first, so the
//       test maps the same pages through /proc/<pid>/fd/<fd>.
//   transfer_node prefill --arena /name --tls tcp --prefill-tp P --rank p --decode-tp D
//                 --target d=<session id> [--target ...] [--rooms N] [--deadline-ms T]
//                 [--no-strided-copies]
//       maps its arena, plans its rooms' copies (strided, or a copy per row with
//       --no-strided-copies: tests/transfer/route_fixture.h), fetches each target's descriptor,
//       submits every room, prints "submitted", waits, prints "result ok <bytes> <seconds>" and
//       exits 0, or "result failed <status>" and exits 3.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/base/error.h"
#include "engine/memory/arena.h"
#include "engine/transfer/peer_directory.h"
#include "engine/transfer/scheduler.h"
#include "engine/transport/factory.h"
#include "engine/transport/handshake/handshake.h"
#include "engine/transport/transport.h"
#include "engine/transport/verbs/softverbs/softverbs.h"
#include "tests/transfer/route_fixture.h"

namespace {

using namespace kvrail;

struct Flags {
  std::string arena;
  uint64_t allocate_bytes = 0;  // decode: Allocate the arena instead of mapping --arena
  std::string tls = "tcp";
  std::string net_devices;
  std::string bind = "127.0.0.1";
  int lanes = 2;
  int prefill_tp = 1;
  int rank = 0;
  int decode_tp = 1;
  std::vector<std::string> targets;
  int rooms = 1;
  int64_t deadline_ms = 60000;
  uint64_t inflight_bytes = 0;
  int room_pages = 480;
  int pages = 511;  // the route's pages a field (RouteSetup::shape), the null one not counted
  bool out_of_bounds = false;      // drill: push the last copy one byte past the peer's arena
  bool no_strided_copies = false;  // a copy per row (RouteSetup::strided_copies false)
};

int Fail(const absl::Status& status) {
  std::printf("result failed %s\n", status.ToString().c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "transfer_node: %s\n", status.ToString().c_str());
  return 3;
}

// --tls verbs: the raw verbs backend over the software provider, its one rail on
// --net-devices (default lo), so that the rail's GID, and the connect endpoint, are that
// device's address and a link set down cuts it.
absl::StatusOr<std::unique_ptr<transport::Transport>> MakeTransport(const Flags& flags) {
  transport::TransportSpec spec;
  spec.lanes = flags.lanes;
  if (flags.tls == "verbs") {
    spec.backend = "verbs";
    spec.verbs_provider = "softverbs";
    transport::softverbs::SetRails(
        {{.device = "softverbs0", .netdev = flags.net_devices.empty() ? "lo" : flags.net_devices}});
    return transport::MakeTransport(spec);
  }
  spec.tls = flags.tls;
  spec.net_devices = flags.net_devices;
  return transport::MakeTransport(spec);
}

// The engine's arena, mapped by name, and registered with a fresh UCX transport.
struct Node {
  Arena arena;
  std::unique_ptr<transport::Transport> transport;
  transport::RegionId region = 0;
};

absl::StatusOr<Node> Open(const Flags& flags) {
  KVRAIL_ASSIGN_OR_RETURN(Arena arena, Arena::OpenShared(flags.arena));
  KVRAIL_ASSIGN_OR_RETURN(auto transport, MakeTransport(flags));
  KVRAIL_ASSIGN_OR_RETURN(const transport::RegionId region,
                          transport->Register({arena.data(), arena.size()}));
  return Node{std::move(arena), std::move(transport), region};
}

// The decode's arena from the transport itself, announced for the test to map.
absl::StatusOr<std::unique_ptr<transport::Transport>> OpenAllocated(const Flags& flags) {
  KVRAIL_ASSIGN_OR_RETURN(auto transport, MakeTransport(flags));
  KVRAIL_ASSIGN_OR_RETURN(const transport::SharedRegion shared,
                          transport->Allocate(flags.allocate_bytes));
  std::printf("arena pid=%d fd=%d offset=%llu placement=%s\n", static_cast<int>(getpid()),
              shared.fd, static_cast<unsigned long long>(shared.fd_offset),
              shared.placement.c_str());
  return transport;
}

int RunDecode(const Flags& flags) {
  std::unique_ptr<transport::Transport> allocated;
  absl::StatusOr<Node> node = absl::FailedPreconditionError("unset");
  std::unique_ptr<transport::Transport>* transport = &allocated;
  if (flags.allocate_bytes == 0 && flags.arena.empty()) {
    return Fail(absl::InvalidArgumentError("decode: give --arena or --allocate-bytes"));
  }
  if (flags.allocate_bytes != 0) {
    auto opened = OpenAllocated(flags);
    if (!opened.ok()) return Fail(opened.status());
    allocated = std::move(*opened);
  } else {
    node = Open(flags);
    if (!node.ok()) return Fail(node.status());
    transport = &node->transport;
  }
  auto server = transport::HandshakeServer::Start(
      flags.bind, 0, [t = transport->get()] { return t->LocalDescriptor(); });
  if (!server.ok()) return Fail(server.status());
  std::printf("session %s\n", (*server)->session_id().c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  (*server)->Stop();
  (*transport)->Close();
  return 0;
}

int RunPrefill(const Flags& flags) {
  auto node = Open(flags);
  if (!node.ok()) return Fail(node.status());
  Arena* arena = &node->arena;
  auto* transport = &node->transport;
  auto* region = &node->region;
  transport::DescriptorCache descriptors(absl::Seconds(10));
  transfer::PeerDirectory directory(transport->get(), &descriptors);
  transfer::SchedulerOptions options;
  options.max_inflight_bytes_per_endpoint = flags.inflight_bytes;
  transfer::Scheduler scheduler(transport->get(), options);

  testing::RouteSetup setup;
  setup.prefill_tp = flags.prefill_tp;
  setup.decode_tp = flags.decode_tp;
  setup.room_pages = flags.room_pages;
  setup.shape.pages = flags.pages;
  setup.strided_copies = !flags.no_strided_copies;

  std::mutex mu;
  std::condition_variable cv;
  int pending = 0;
  absl::Status first_error;
  uint64_t bytes = 0;
  const absl::Time start = absl::Now();
  for (const std::string& target : flags.targets) {
    const size_t eq = target.find('=');
    int d = -1;
    if (eq == std::string::npos || !absl::SimpleAtoi(target.substr(0, eq), &d)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--target ", target, ": expected <decode rank>=<session id>")));
    }
    const std::string session = target.substr(eq + 1);
    auto copies = testing::RoomCopies(setup, flags.rank, d);
    if (!copies.ok()) return Fail(copies.status());
    auto link = directory.Get(session);
    if (!link.ok()) return Fail(link.status());
    auto descriptor = descriptors.Get(session);
    if (!descriptor.ok()) return Fail(descriptor.status());
    for (int r = 0; r < flags.rooms; ++r) {
      transfer::Transfer room;
      room.transfer_id = static_cast<uint64_t>(d) * 100000 + r;
      room.peer = link->peer;
      room.source = *region;
      room.source_length = arena->size();
      room.remote = link->regions;
      room.remote_base = (*descriptor)->regions(0).base();  // B_dst (CACHEPD §6.9)
      room.copies = *copies;
      if (flags.out_of_bounds) {
        Copy& last = room.copies[room.copies.size() - 1];
        last.dst_offset = (*descriptor)->regions(0).length() - last.length + 1;
      }
      room.deadline = absl::Now() + absl::Milliseconds(flags.deadline_ms);
      room.done = [&](const transfer::TransferOutcome& outcome) {
        std::lock_guard<std::mutex> lock(mu);
        if (outcome.status.ok()) {
          bytes += outcome.stats.bytes;
        } else if (first_error.ok()) {
          first_error = outcome.status;
        }
        --pending;
        cv.notify_all();
      };
      {
        std::lock_guard<std::mutex> lock(mu);
        ++pending;
      }
      const absl::Status submitted = scheduler.Submit(std::move(room));
      if (!submitted.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        --pending;
        if (first_error.ok()) first_error = submitted;
      }
    }
  }
  std::printf("submitted\n");
  std::fflush(stdout);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!first_error.ok()) return Fail(first_error);
  std::printf("result ok %llu %.3f\n", static_cast<unsigned long long>(bytes), seconds);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvrail multi-process transfer test node"};
  app.require_subcommand(1);
  Flags flags;
  for (const char* role : {"decode", "prefill"}) {
    CLI::App* sub = app.add_subcommand(role);
    CLI::Option* arena = sub->add_option("--arena", flags.arena);
    sub->add_option("--tls", flags.tls);
    sub->add_option("--net-devices", flags.net_devices);
    sub->add_option("--lanes", flags.lanes);
    if (std::string(role) == "decode") {
      sub->add_option("--bind", flags.bind);
      sub->add_option("--allocate-bytes", flags.allocate_bytes)->excludes(arena);
    } else {
      arena->required();
      sub->add_option("--prefill-tp", flags.prefill_tp);
      sub->add_option("--rank", flags.rank);
      sub->add_option("--decode-tp", flags.decode_tp);
      sub->add_option("--target", flags.targets)->required();
      sub->add_option("--rooms", flags.rooms);
      sub->add_option("--deadline-ms", flags.deadline_ms);
      sub->add_option("--inflight-bytes", flags.inflight_bytes);
      sub->add_option("--room-pages", flags.room_pages);
      sub->add_option("--pages", flags.pages);
      sub->add_flag("--out-of-bounds", flags.out_of_bounds);
      sub->add_flag("--no-strided-copies", flags.no_strided_copies);
    }
  }
  CLI11_PARSE(app, argc, argv);
  if (app.got_subcommand("decode")) return RunDecode(flags);
  return RunPrefill(flags);
}
