package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpucoord/gpucoord/internal/bench"
	"github.com/gpucoord/gpucoord/internal/rankexe"
)

func init() { subcommands = append(subcommands, newBenchCmd, newBenchWorkerCmd) }

// benchWorkerCmd is the hidden child of bench: one rank of a TCP world.
const benchWorkerCmd = "bench-worker"

func newBenchCmd() *cobra.Command {
	cfg := bench.DefaultConfig()
	var sizes, op string
	var asJSON, asLines bool
	cmd := &cobra.Command{
		Use:   "bench [OP]",
		Short: "Time collectives (allreduce, reducescatter, allgather, broadcast) like nccl-tests",
		Long: `Time a collective on N local ranks and print, per size, the median time
and algbw/busbw in GB/s (1e9 bytes; busbw = algbw * 2(n-1)/n for allreduce,
(n-1)/n for reducescatter and allgather, 1 for broadcast, as nccl-tests).

  gpucoord bench allreduce --np 4 --sizes 4K:64M --backend tcp
  gpucoord bench allgather --np 2 --sizes 1M,16M --json
  gpucoord bench allreduce --np 8 --sizes 8K:1G --backend nccl

Ranks are child processes over TCP on 127.0.0.1 (--backend tcp) or shared
memory (--backend shm), or goroutines with --inproc
(always with --backend inmem).

--backend nccl is the pre-flight check of a GPU machine, what nccl-tests
does without building anything: one process per rank, each timing NCCL on
buffers in GPU memory, with every size's result checked. Rank r runs on
GPU r mod GPUs; ranks that share a GPU get NCCL_HOSTIDs of their own, so
--np may exceed the GPUs. Where NCCL (libnccl.so.2, 2.14 or later), the
CUDA runtime or a GPU is missing, it fails at once with one line saying
which, and starts nothing (GPUCOORD_NCCL_LIBRARY and
GPUCOORD_CUDART_LIBRARY point it at other libraries). --inproc with nccl
needs a GPU per rank. Each JSON result carries the host name, so that the
runs of several nodes compare line by line.

Every rank holds buffers for the largest size (the buffer, a 1/np shard
and, for reducescatter, a scratch copy): --np 4 --sizes 4G needs about
20 GiB. bench refuses, before allocating, a run that needs more than 80% of
the memory available (MemAvailable in /proc/meminfo).

The timing protocol is that of the peer baselines: to compare with PyTorch
gloo or OpenMPI, run them side by side with --jsonl; docs/BENCHMARKS.md
says how.`,
		Args:      cobra.MaximumNArgs(1),
		ValidArgs: bench.Ops,
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 1 {
				if c.Flags().Changed("op") && op != args[0] {
					return usageError(fmt.Errorf("bench: operation %q and --op %q disagree", args[0], op))
				}
				op = args[0]
			}
			cfg.Op = op
			var err error
			if cfg.Sizes, err = bench.ParseSizes(sizes); err != nil {
				return usageError(err)
			}
			if asJSON && asLines {
				return usageError(fmt.Errorf("bench: --json and --jsonl exclude each other"))
			}
			if !cfg.InProc && cfg.Backend != "inmem" {
				exe, err := rankexe.Path()
				if err != nil {
					return err
				}
				cfg.WorkerCommand = []string{exe, benchWorkerCmd}
			}
			cfg.Stderr = c.ErrOrStderr()
			if err := cfg.Validate(); err != nil {
				return usageError(err)
			}
			// Refuse before allocating a run that cannot fit; where the
			// available memory cannot be read, run unchecked.
			if avail, err := bench.MemAvailable(); err == nil {
				if err := cfg.CheckMemory(avail); err != nil {
					return usageError(err)
				}
			}
			return runBench(c, cfg, asJSON, asLines)
		},
	}
	f := cmd.Flags()
	f.StringVar(&op, "op", cfg.Op, "operation: "+strings.Join(bench.Ops, ", "))
	f.IntVar(&cfg.NP, "np", cfg.NP, "number of ranks")
	f.StringVar(&sizes, "sizes", "4K:64M", "sizes in bytes: LO:HI (powers of two), a comma list, or one size; K, M, G suffixes")
	f.StringVar(&cfg.Backend, "backend", cfg.Backend, "transport: "+strings.Join(bench.Backends, ", "))
	f.BoolVar(&cfg.InProc, "inproc", false, "run the ranks as goroutines of this process")
	f.IntVar(&cfg.Warmup, "warmup", cfg.Warmup, "untimed operations per size")
	f.IntVar(&cfg.Iters, "iters", 0, "timed samples per size (0: 7..50 within --budget)")
	f.IntVar(&cfg.Batch, "batch", 0, "operations per sample (0: enough for --min-sample, at most 100)")
	f.DurationVar(&cfg.MinSample, "min-sample", cfg.MinSample, "shortest sample the automatic batch aims for")
	f.DurationVar(&cfg.Budget, "budget", cfg.Budget, "time for the samples of one size")
	f.IntVar(&cfg.ChunkBytes, "chunk", 0, "pipeline piece size in bytes (0: default)")
	f.IntVar(&cfg.DirectBytes, "direct", 0, "largest allreduce done in one all-to-all round (0: default, -1: none)")
	f.IntVar(&cfg.SmallBytes, "small", 0, "largest allreduce/broadcast using the latency algorithms (0: default, -1: none)")
	f.IntVar(&cfg.SocketBuffer, "sockbuf", 0, "TCP send/receive buffer in bytes (0: kernel autotuning)")
	f.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "fail an operation whose peer is silent this long")
	f.BoolVar(&asJSON, "json", false, "print a JSON list of results")
	f.BoolVar(&asLines, "jsonl", false, "print one JSON object per line (the form peer-comparison drivers read)")
	return cmd
}

func runBench(c *cobra.Command, cfg *bench.Config, asJSON, asLines bool) error {
	out := c.OutOrStdout()
	all := []bench.Result{}
	// The table's header comes with the first result, so that a run that
	// cannot start (no NCCL, say) prints nothing but its error.
	header := func(r bench.Result) {
		where := ""
		if cfg.InProc || cfg.Backend == "inmem" {
			where = " (in-process)"
		}
		if cfg.Backend == "nccl" {
			where += " on GPU memory"
		}
		fmt.Fprintf(out, "# %s, %d ranks on %s, backend %s%s, float32 sum\n", cfg.Op, cfg.NP, r.Host, cfg.Backend, where)
		fmt.Fprintf(out, "%12s %11s %12s %13s %13s %8s\n", "size (B)", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "correct")
	}
	enc := json.NewEncoder(out)
	err := bench.Run(c.Context(), cfg, func(r bench.Result) error {
		switch {
		case asLines:
			all = append(all, r)
			return enc.Encode(r)
		case asJSON:
			all = append(all, r)
			return nil
		}
		if len(all) == 0 {
			header(r)
		}
		all = append(all, r)
		_, err := fmt.Fprintf(out, "%12d %11d %12.1f %13.3f %13.3f %8v\n", r.SizeBytes, r.Count, r.Seconds*1e6, r.AlgBW, r.BusBW, r.Correct)
		return err
	})
	if asJSON && (err == nil || len(all) > 0) {
		b, jerr := json.MarshalIndent(all, "", "  ")
		if jerr != nil {
			return jerr
		}
		fmt.Fprintln(out, string(b))
	}
	if err != nil {
		return err
	}
	if slices.ContainsFunc(all, func(r bench.Result) bool { return !r.Correct }) {
		return fmt.Errorf("bench: a result was wrong")
	}
	return nil
}

func newBenchWorkerCmd() *cobra.Command {
	return &cobra.Command{
		Use:    benchWorkerCmd,
		Short:  "one rank of `gpucoord bench` (started by it; settings in " + bench.WorkerEnv + ")",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return bench.RunWorker(c.Context(), c.OutOrStdout())
		},
	}
}
