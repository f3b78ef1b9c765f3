// Command gpucoord plans, launches, benchmarks and runs 3D-parallel
// training jobs.
//
// It is flags and wiring only: each subcommand lives in its own file, parses
// its flags into a package's Config, validates it and runs the package.
// `gpucoord plan` is topology + topology/estimate, `gpucoord bench` is
// internal/bench, `gpucoord train` is worker/engine, `gpucoord coordinator`
// is coordinator, `gpucoord worker` is worker, `gpucoord status` is client,
// and `gpucoord launch` submits and follows a job through client, to a
// coordinator or, with --standalone, to an embedded etcd, a coordinator and
// local agents it wires together in one process (launch.go). Exit
// status: 0 on success, 1 on a failure while running, 2 on invalid input,
// 3 when `plan` finds that a layout does not fit, 130 when interrupted;
// launch exits with its job's status (the first failing rank's code).
package main
