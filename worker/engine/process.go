package engine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/nccl"
	"github.com/gpucoord/gpucoord/collectives/tcp"
)

// Process is one rank of a job run as its own operating-system process,
// joined to the others over TCP through a rendezvous store.
type Process struct {
	// Rank is the global rank.
	Rank int
	// Store is the address of the world's collectives/tcp store, and
	// StoreSecret its secret.
	Store       string
	StoreSecret []byte
	// Bind is the host the rank's TCP listener binds; empty is 127.0.0.1.
	Bind string
	// Advertise is the host peers dial this rank at; empty is Bind.
	Advertise string
	// SaveParams, when set, is the directory the final parameters go to.
	SaveParams string
	// Log receives the rank's log lines.
	Log io.Writer
	// NCCL, when set, makes the TP, PP and DP groups NCCL communicators
	// (nccl.NewWorld) built from this configuration with the world's store
	// and Log; an empty Key becomes "nccl". The engine's buffers stay in
	// host memory. Nil keeps every group on the TCP world.
	NCCL *nccl.Config
}

// RunProcess trains cfg as rank p.Rank of a TCP world: it dials the store,
// connects to every peer, runs Train with report (its groups over NCCL with
// p.NCCL), saves the parameters if asked, and leaves with the others
// through a double barrier, so that no rank closes its sockets while a peer
// still finishes its last collective.
func RunProcess(ctx context.Context, cfg *Config, p Process, report func(StepResult) error) error {
	st, err := tcp.DialStore(ctx, p.Store, p.StoreSecret)
	if err != nil {
		return err
	}
	defer st.Close()
	// Once every rank has passed the first final barrier, sockets closing
	// are the expected end, not news: raise the level then.
	level := new(slog.LevelVar)
	log := slog.New(slog.NewTextHandler(p.Log, &slog.HandlerOptions{Level: level}))
	tc := tcp.DefaultConfig()
	tc.Rank, tc.Size, tc.Store, tc.Logger = p.Rank, cfg.World(), st, log
	if p.Bind != "" {
		tc.ListenAddr = net.JoinHostPort(p.Bind, "0")
	}
	tc.Advertise = p.Advertise
	t, err := tcp.New(ctx, tc)
	if err != nil {
		return fmt.Errorf("rank %d: connect: %w", p.Rank, err)
	}
	defer t.Close()
	cc := collectives.DefaultConfig()
	cc.Logger = log
	world, err := collectives.New(t, cc)
	if err != nil {
		return err
	}
	defer world.Close()
	var w collectives.Communicator = world
	if p.NCCL != nil {
		nc := *p.NCCL
		nc.Store, nc.Logger = st, log
		if nc.Key == "" {
			nc.Key = "nccl"
		}
		w = nccl.NewWorld(world, &nc)
	}
	r, err := Train(ctx, cfg, w, report)
	if r != nil {
		defer r.Close()
	}
	if err != nil {
		return err
	}
	if p.SaveParams != "" {
		if err := r.WriteParams(ctx, p.SaveParams); err != nil {
			return err
		}
	}
	if err := world.Barrier(ctx); err != nil {
		return err
	}
	level.Set(slog.LevelError)
	return world.Barrier(ctx)
}
