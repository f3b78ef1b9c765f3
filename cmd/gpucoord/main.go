package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	interrupted := ctx.Err() != nil
	stop()
	if err != nil && interrupted {
		// Stopped by SIGINT or SIGTERM: the shell's convention, 128+SIGINT.
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
