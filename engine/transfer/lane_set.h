// Which of a peer's lanes a transfer may post on (Transfer::lanes), and the set a writer into a
// peer that several writers share should use (WriterLanes). Pure: no transport, no threads.
#ifndef KVRAIL_ENGINE_TRANSFER_LANE_SET_H_
#define KVRAIL_ENGINE_TRANSFER_LANE_SET_H_

#include <string>

namespace kvrail::transfer {

// Lanes first, first + step, first + 2 * step, ... below the transport's lane count. The default
// is every lane.
struct LaneSet {
  int first = 0;
  int step = 1;

  bool Every() const { return first == 0 && step == 1; }
  // How many of `lanes` lanes the set holds: 0 when `first` is past them, and for a set that is
  // no set (a negative first, a step below 1). Scheduler::Submit refuses a transfer whose set
  // holds none.
  int CountIn(int lanes) const {
    if (first < 0 || step < 1 || first >= lanes) return 0;
    return (lanes - first + step - 1) / step;
  }
  // "every lane", "lanes 1, 3 of 4" for `lanes` lanes, or "no lane of 4".
  std::string Describe(int lanes) const;
};

bool operator==(const LaneSet& a, const LaneSet& b);

// The lanes writer `writer` (0-based) of `writers` that write into one peer should post on, out
// of `lanes`: where the peer's lane threads receive what each lane carries
// (transport::Capabilities::peer_lanes_receive: UCX over tcp, where a decode's lane reads each
// connection's messages and copies them in), a peer lane that reads several writers' connections
// pays for each of them, so with writers <= lanes each writer takes the lanes l with l % writers
// == writer % writers and each peer lane reads one writer. With one writer, or more writers than
// lanes, every lane. Lane l of this side writes through the peer's lane l % (its lane count)
// (transport.h), so the peer's lanes follow the writers where it has as many lanes as this side,
// or a multiple of `writers`.
LaneSet WriterLanes(int lanes, int writers, int writer);

}  // namespace kvrail::transfer

#endif  // KVRAIL_ENGINE_TRANSFER_LANE_SET_H_
