// Package topology turns a cluster, a model and a parallel configuration into
// a Plan: the rank map, every process group, and a verdict on whether it fits.
//
// It is pure planning: no goroutines, no I/O beyond parsing the specs it is
// handed, no wall clock. Estimates (memory, FLOPs, traffic, step time) live in
// topology/estimate.
package topology
