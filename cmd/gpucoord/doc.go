// Command gpucoord plans, benchmarks and runs 3D-parallel training jobs.
//
// It is flags and wiring only: each subcommand lives in its own file, parses
// its flags into a package's Config, validates it and runs the package.
// `gpucoord plan` is topology + topology/estimate, `gpucoord bench` is
// internal/bench, `gpucoord train` is worker/engine. Exit status: 0 on
// success, 1 on a failure while running, 2 on invalid input, 3 when `plan`
// finds that a layout does not fit.
package main
