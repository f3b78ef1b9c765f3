package gpucoordpb

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"time"
)

// RelayWait is how long a member's Watch stream leaves a new assignment
// to its relay (RelayedRenewal.assignment), from when the relay's stream
// sent it, before it sends it itself, unless the relay reports it
// delivered (Delivered). A relay reports the members that took theirs
// within a third of it, and those that take theirs later, once all have
// answered. At a new generation of 16,384 simulated nodes on two cores,
// one second made 1,040 and 2,433 of the 47,614 assignments of a run go
// out twice (the relays' messages and reports waiting behind the burst),
// and those sends are more of the burst.
const RelayWait = 2 * time.Second

// RelayKeySize is the size of a stream's relay key (Assignment.relay_key).
const RelayKeySize = 32

// RelayMAC is the MAC of a relayed assignment (RelayedRenewal.mac): HMAC-
// SHA256, with the member's stream's relay key, of its session,
// lease_ttl_ms, sent_unix_nanos and assignment, each field of fixed size
// but the last, so that no two messages share an input.
func RelayMAC(key []byte, r *RelayedRenewal) []byte {
	m := hmac.New(sha256.New, key)
	var b [24]byte
	binary.BigEndian.PutUint64(b[0:], r.GetSession())
	binary.BigEndian.PutUint64(b[8:], uint64(r.GetLeaseTtlMs()))
	binary.BigEndian.PutUint64(b[16:], uint64(r.GetSentUnixNanos()))
	m.Write(b[:])
	m.Write(r.GetAssignment())
	return m.Sum(nil)
}

// RelayMACValid says whether r's MAC is the one key gives it.
func RelayMACValid(key []byte, r *RelayedRenewal) bool {
	return len(key) == RelayKeySize && hmac.Equal(r.GetMac(), RelayMAC(key, r))
}
