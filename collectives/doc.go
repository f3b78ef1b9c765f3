// Package collectives implements process-group collectives (all-reduce,
// reduce-scatter, all-gather, broadcast, point-to-point, barrier) over a
// Transport. It knows nothing of jobs or plans.
package collectives
