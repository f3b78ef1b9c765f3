// Package collectivestest is the conformance suite every transport of
// gpucoord/collectives runs: each operation against a naive reference for
// world sizes 1-8 and awkward lengths, bit-identical results across ranks,
// concurrent sub-groups, mismatch, timeout and cancellation.
// KilledPeerProcess checks, across real processes, that a transport notices
// a peer killed with SIGKILL; its helper process runs HelperMain.
//
// # Usage
//
// A transport's test builds worlds and hands them over:
//
//	func TestConformance(t *testing.T) {
//		collectivestest.Run(t, func(t *testing.T, n int, cfg *collectives.Config) []*collectives.Comm {
//			... n connected world communicators, closed by t.Cleanup ...
//		})
//	}
package collectivestest
