package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
)

func main() {
	// SIGHUP (a dropped ssh session) and SIGTERM stop a command as Ctrl-C
	// does: launch cancels its job rather than leave it running unseen.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	stopProfile := cpuProfile()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stopProfile()
	interrupted := ctx.Err() != nil
	stop()
	var silent *exitError
	if errors.As(err, &silent) && silent.err == nil {
		// The outcome was said already (or by another process: a Slurm
		// step's other tasks): the exit code alone.
		os.Exit(silent.code)
	}
	if err != nil && interrupted {
		// Stopped by SIGINT, SIGTERM or SIGHUP: the shell's convention,
		// 128+SIGINT.
		fmt.Fprintln(os.Stderr, "gpucoord: interrupted:", err)
		os.Exit(exitInterrupted)
	}
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.err != nil {
				fmt.Fprintln(os.Stderr, "gpucoord:", ee.err)
			}
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "gpucoord:", err)
		os.Exit(1)
	}
}

// cpuProfile writes the process's CPU profile to the file
// GPUCOORD_CPUPROFILE names, if any, until the returned function is
// called: how the benchmarks see where a coordinator's time goes.
func cpuProfile() func() {
	path := os.Getenv("GPUCOORD_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpucoord: GPUCOORD_CPUPROFILE:", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
