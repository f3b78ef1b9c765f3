// Package topology turns a cluster, a model and a parallel configuration into
// a Plan: the rank map, every process group, and a verdict on whether it fits.
//
// NewShape states the rules of a parallel shape once (dp from the world
// size, the batch split, the schedule's rules), for the planner, the engine
// and the coordinator alike.
//
// It is pure planning: no goroutines, no I/O beyond parsing the specs it is
// handed, no wall clock. Estimates (memory, FLOPs, traffic, step time) live in
// topology/estimate.
package topology
