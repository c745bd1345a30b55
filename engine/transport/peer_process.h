// The process that owns a peer's regions, watched from this host: whether it has exited.
//
// Over shared memory a writer stores into the peer's segment, which stays mapped here when the
// peer dies, so neither the stores nor a flush of them can fail: a write "landed" in memory
// nobody owns any more, and until UCX's keepalive noticed (about a second later) a transfer to
// a decode that had died reported Success. A transport therefore publishes its process in its
// handshake descriptor (HandshakeDescriptor::owner), and a writer that knows the peer is on its
// host (ucx: shared memory alone, or a region mapped here) watches it through a pidfd: a flush
// into that peer's memory completes OK only while the process lives.
//
// A watch is made only where the identity is certainly this host's and this pid namespace's
// process (same boot id, same pid namespace, same start time after the pidfd was opened);
// anything else, a peer elsewhere included, is not watched, and the transport then knows of a
// death only through its own means (UCX's keepalive, a reset connection).
#ifndef KVRAIL_ENGINE_TRANSPORT_PEER_PROCESS_H_
#define KVRAIL_ENGINE_TRANSPORT_PEER_PROCESS_H_

#include <memory>
#include <string>

#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {

// Process `pid` of this pid namespace as a peer would publish it: the host's boot id, its pid
// namespace, pid and start time. Fields it cannot read are left empty or zero (a peer then does
// not watch it).
v1::ProcessIdentity ProcessIdentityOf(int pid);
// This process (ProcessIdentityOf(getpid())): what a transport's descriptor carries. Empty where
// /proc does not show this pid namespace (its entry for getpid() is another process): a peer
// then does not watch it, and this process watches nobody.
v1::ProcessIdentity SelfProcess();

class PeerProcess {
 public:
  // A watch of `identity`'s process where it is certainly a process of this host and pid
  // namespace (see the file comment): one that has exited already where its pid is gone or
  // names a process started at another time. Null where the identity is another host's or
  // namespace's, or unset, or /proc or a pidfd cannot be had: never an error, a peer that
  // cannot be watched is written to as before.
  static std::unique_ptr<PeerProcess> Watch(const v1::ProcessIdentity& identity);
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  // Whether the process has exited (a zombie its parent has not reaped counts as exited). One
  // poll of the pidfd, no wait; any thread.
  bool Exited() const;
  int pid() const { return pid_; }

 private:
  PeerProcess(int pidfd, int pid) : pidfd_(pidfd), pid_(pid) {}
  int pidfd_;  // -1: the process had gone when the watch was made
  int pid_;
};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_PEER_PROCESS_H_
