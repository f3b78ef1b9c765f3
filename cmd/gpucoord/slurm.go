package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"

	"github.com/gpucoord/gpucoord/client"
	"github.com/gpucoord/gpucoord/coordinator"
	"github.com/gpucoord/gpucoord/internal/gossip"
	"github.com/gpucoord/gpucoord/internal/inproc"
	"github.com/gpucoord/gpucoord/internal/pki"
	"github.com/gpucoord/gpucoord/internal/rankexe"
	"github.com/gpucoord/gpucoord/internal/slurm"
	"github.com/gpucoord/gpucoord/internal/slurmboot"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker"
	"github.com/gpucoord/gpucoord/worker/ckpt"
	"github.com/gpucoord/gpucoord/worker/ranklog"
)

// slurmCoordinators is how many of a step's first nodes run a
// coordinator, each with a member of the embedded etcd: three survive the
// loss of any one.
const slurmCoordinators = 3

// requeueReason starts the reason of a job launch stopped after SIGUSR1
// (sbatch --signal=USR1@T): it exits with exitRequeue.
const requeueReason = "stopped for a requeue"

// envSlurmSecret is the shared secret the tasks of a step seal their
// bootstrap with on a cluster without MUNGE.
const envSlurmSecret = "GPUCOORD_SLURM_SECRET"

// detectSlurm reads the Slurm step launch runs in, if any, into f.slurm.
// Under --slurm=auto an explicit --standalone or --coordinator wins.
func (f *launchFlags) detectSlurm() error {
	mode, err := slurm.ParseMode(f.slurmMode)
	if err != nil {
		return fmt.Errorf("--slurm: %w", err)
	}
	env, in, err := slurm.Detect(mode, os.Getenv)
	switch {
	case err != nil:
		return err
	case !in:
		return nil
	case f.standalone || f.coordinator != "":
		if mode == slurm.ModeOn {
			return errors.New("--slurm=on runs the job on the Slurm step's own nodes: leave out --standalone and --coordinator")
		}
		return nil
	}
	f.slurm = &env
	return nil
}

// slurmDefaults fills what Slurm says and the flags left out: --nodes is
// the step's node count less --spares, --gpus-per-node the GPUs Slurm gave
// the node, the job id the Slurm job's (the same again when it is
// requeued). A job goes on after a node is lost (--max-restarts 10,
// --min-nodes the fewest that hold one model replica) as far as Slurm lets
// the step go on: under --no-kill. Slurm 22.05 tells its tasks nothing of
// --no-kill (no SLURM_NO_KILL in a task's environment), so the defaults
// cannot depend on it.
func (f *launchFlags) slurmDefaults(c *cobra.Command) error {
	env := f.slurm
	changed := c.Flags().Changed
	if f.hostfile != "" || f.detach || f.dataDir != "" {
		return errors.New("under Slurm the step's nodes run the job: --hostfile, --detach and --data-dir do not apply (--slurm=off to ignore Slurm)")
	}
	if f.spares < 0 || f.spares >= env.NNodes {
		return fmt.Errorf("--spares %d: the step has %d nodes, and at least one must run the job", f.spares, env.NNodes)
	}
	if !changed("nodes") {
		f.nodes = env.NNodes - f.spares
	} else if changed("spares") && f.nodes != env.NNodes-f.spares {
		return fmt.Errorf("--nodes %d and --spares %d: the step has %d nodes; give one of them", f.nodes, f.spares, env.NNodes)
	}
	if _, err := gossip.Profile(f.gossipProfile); err != nil {
		return fmt.Errorf("--gossip-profile: %w", err)
	}
	if f.nodes > env.NNodes {
		return fmt.Errorf("--nodes %d: the Slurm step has %d nodes (%s)", f.nodes, env.NNodes, env.Nodes[0]+"...")
	}
	if !changed("gpus-per-node") {
		if env.GPUsOnNode == 0 {
			return errors.New("--gpus-per-node: Slurm gave this node no GPUs (SLURM_GPUS_ON_NODE and CUDA_VISIBLE_DEVICES unset): ask for them (--gpus-per-node, --gres=gpu:N) or give launch --gpus-per-node for CPU processes")
		}
		f.gpus = env.GPUsOnNode
	}
	if !changed("job-id") {
		f.jobID = "slurm-" + env.JobID
	}
	if !changed("max-restarts") {
		f.maxRestarts = 10
	}
	if !changed("min-nodes") && f.gpus > 0 {
		f.minNodes = min(f.nodes, max(1, (f.tp*f.pp+f.gpus-1)/f.gpus))
	}
	return nil
}

// slurmTask is one task's part: its node, its coordinator if it runs one,
// and whether it prints the job.
type slurmTask struct {
	f      *launchFlags
	env    slurm.Env
	node   string
	ip     string // this node's address
	first  string // the step's first node's
	state  string // this task's directory, removed at the end
	held   string // its agent's checkpoints (in /dev/shm when it has room), removed at the end
	log    *slog.Logger
	stdout io.Writer
	stderr io.Writer
	// killWait is slurm.conf's KillWait: how long after a cancel's SIGTERM
	// Slurm sends SIGKILL.
	killWait time.Duration
	// stopAtBackup is set by SIGUSR1: the job is cancelled at its next
	// step in the backup tier.
	stopAtBackup atomic.Bool
}

// runSlurm runs the job as a task of a Slurm step: every task runs an
// agent, the first three a coordinator each (one etcd cluster), and the
// first prints the job.
func (f *launchFlags) runSlurm(c *cobra.Command, spec *pb.JobSpec) error {
	ctx := c.Context()
	env := *f.slurm
	t := &slurmTask{f: f, env: env, node: env.Nodes[env.NodeID],
		stdout: &lockedWriter{w: c.OutOrStdout()}, stderr: &lockedWriter{w: c.ErrOrStderr()}}
	level := slog.LevelError
	if f.verbose {
		level = slog.LevelInfo
	}
	t.killWait = slurmKillWait()
	t.log = slog.New(slog.NewTextHandler(t.stderr, &slog.HandlerOptions{Level: level})).With("slurm_node", t.node)
	// Node-local state, named by the Slurm job, removed at the end.
	var err error
	if t.state, err = os.MkdirTemp("", fmt.Sprintf("gpucoord-slurm-%s.%s-", env.JobID, env.StepID)); err != nil {
		return err
	}
	defer os.RemoveAll(t.state)
	if t.held, err = worker.TempCheckpointRoot(t.state, filepath.Base(t.state)+"-"); err != nil {
		return err
	}
	defer os.RemoveAll(t.held)
	if t.ip, err = slurmAddress(ctx, env); err != nil {
		return err
	}
	if t.first, err = lookup(ctx, env.Nodes[0]); err != nil {
		return fmt.Errorf("the step's first node %s: its address: %w", env.Nodes[0], err)
	}
	grant, self, stopBoot, err := t.bootstrap(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	defer stopBoot()
	nc, creds, agentTLS, err := t.nodeConfig(spec, grant, self)
	if err != nil {
		return err
	}
	node, err := inproc.StartNode(context.WithoutCancel(ctx), nc)
	if err != nil {
		return fmt.Errorf("node %s: %w", t.node, err)
	}
	defer node.Stop()
	// Its agent registered is the control plane up: only then follow, or
	// a follower would meet coordinators not up yet and back off past a
	// short job's end.
	select {
	case <-node.Ready():
	case <-node.Failed():
		return fmt.Errorf("node %s: %w", t.node, node.Err())
	case <-time.After(f.bootTimeout):
		return fmt.Errorf("node %s: its agent did not register with the step's coordinators within %s (launch -v shows why)", t.node, f.bootTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	var addrs []string
	for _, m := range grant.Members {
		addrs = append(addrs, m.Addr)
	}
	printer := env.NodeID == 0
	if printer {
		t.resumeFromBackup(spec)
	}
	fl := &follower{addrs: addrs, creds: creds, connectTimeout: f.auth.connectTimeout, spec: spec, json: f.json,
		out: t.stdout, progress: t.stdout, notFoundFor: 2 * time.Minute}
	if f.json {
		fl.progress = t.stderr
	}
	var muted *mutable
	if printer {
		fl.output = newRankOutput(f.output, spec.Id, ranklog.NewClient(agentTLS), rankLines(t.stdout, t.stderr, f.json), fl.progress)
	} else {
		// The other tasks follow the job in silence: the first task prints
		// it. A coordinator task speaks up once the tasks before it are
		// gone (salloc: the first node lost, the job goes on).
		muted = &mutable{}
		progress := fl.progress
		fl.quiet, fl.out, fl.progress = true, muted.wrap(fl.out), muted.wrap(fl.progress)
		if self != nil {
			wctx, stopWatch := context.WithCancel(ctx)
			watched := make(chan struct{})
			go func() { defer close(watched); t.takeOver(wctx, spec.Id, addrs, creds, muted, progress) }()
			defer func() { stopWatch(); <-watched }()
		}
	}
	speaking := func() bool { return muted == nil || !muted.silent() }
	if spec.CheckpointBackup != "" {
		// The newest step the backup tier holds whole goes in a mark there,
		// for a requeued run of the job to resume from.
		backup := worker.SharedCheckpointDir(spec.CheckpointBackup, spec.Id)
		fl.onBackup = func(c *pb.Step) {
			if !speaking() {
				return
			}
			if err := ckpt.WriteBackupMark(backup, ckpt.BackupMark{Step: c.Step, Generation: c.Generation, Dp: c.Dp}); err != nil {
				fmt.Fprintf(t.stderr, "gpucoord: marking step %d in the backup tier: %v\n", c.Step, err)
			}
			if t.stopAtBackup.Load() {
				go t.cancel(addrs, creds, spec.Id, fmt.Sprintf("%s after step %d, in the backup tier (SIGUSR1)", requeueReason, c.Step))
			}
		}
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	go func() {
		for range usr1 {
			if !speaking() {
				continue // the first task stops the job
			}
			if spec.CheckpointBackup == "" {
				fmt.Fprintf(t.stderr, "gpucoord: SIGUSR1: the job has no backup tier (--checkpoint-backup): it stops now, and a requeue starts it over\n")
				go t.cancel(addrs, creds, spec.Id, requeueReason+" (SIGUSR1), with no backup tier")
				continue
			}
			if !t.stopAtBackup.Swap(true) {
				fmt.Fprintf(t.stderr, "gpucoord: SIGUSR1: the job stops once its next step is in the backup tier, for a requeue\n")
			}
		}
	}()
	err = fl.run(ctx)
	var outcome *exitError
	if muted != nil && muted.silent() && errors.As(err, &outcome) {
		// The job's outcome: the first task says it.
		err = &exitError{code: outcome.code}
	}
	node.StopAgent()
	if self != nil {
		linger := 10 * time.Second
		if ctx.Err() != nil {
			// Cancelled (scancel): Slurm kills what is left after KillWait,
			// and a task killed leaves its directories behind.
			linger = t.killWait / 4
		}
		t.awaitAgentsGone(addrs, creds, linger)
	}
	return err
}

// bootstrap agrees with the step's other tasks on the CA and the
// coordinators; self is this task's coordinator, nil when it runs none.
// stop ends the first task's bootstrap server.
func (t *slurmTask) bootstrap(ctx context.Context) (slurmboot.Grant, *slurmboot.Member, func(), error) {
	env := t.env
	sealer, err := slurmSealer(t.f.mungeSocket)
	if err != nil {
		return slurmboot.Grant{}, nil, nil, err
	}
	k := min(slurmCoordinators, env.NNodes)
	bc := slurmboot.Config{Job: env.JobID, Step: env.StepID, Node: t.node, NodeID: env.NodeID, Coordinators: k, Sealer: sealer,
		Server: t.first, Bind: t.ip, Ports: slurmboot.Ports(env.JobID, env.StepID, os.Getenv("SLURM_STEP_RESV_PORTS"), 8),
		Timeout: t.f.bootTimeout, Logger: t.log}
	if env.NodeID < k {
		ports, err := freePorts(t.ip, 2)
		if err != nil {
			return slurmboot.Grant{}, nil, nil, err
		}
		bc.Self = &slurmboot.Member{Name: t.node, Addr: net.JoinHostPort(t.ip, strconv.Itoa(ports[0])),
			PeerURL: "https://" + net.JoinHostPort(t.ip, strconv.Itoa(ports[1]))}
	}
	if env.NodeID != 0 {
		g, err := slurmboot.Fetch(ctx, bc)
		if err != nil {
			return g, nil, nil, fmt.Errorf("node %s: %w", t.node, err)
		}
		return g, bc.Self, func() {}, nil
	}
	srv, err := slurmboot.Serve(ctx, bc)
	if err != nil {
		return slurmboot.Grant{}, nil, nil, err
	}
	g, err := srv.Grant(ctx)
	if err != nil {
		srv.Close()
		return g, nil, nil, err
	}
	return g, bc.Self, srv.Close, nil
}

// nodeConfig writes this task's credentials into its state directory and
// returns what its node runs, and the launch client's credentials (for the
// coordinators, and the agents' rank output).
func (t *slurmTask) nodeConfig(spec *pb.JobSpec, g slurmboot.Grant, self *slurmboot.Member) (inproc.NodeConfig, credentials.TransportCredentials, *tls.Config, error) {
	var nc inproc.NodeConfig
	var ca *pki.CA
	nodeCreds := pki.Credentials{CA: g.CA, Cert: g.Cert, Key: g.Key}
	// The launch client's: the coordinators' client, the agents' reader.
	clientCreds := pki.Credentials{CA: g.CA, Cert: g.ClientCert, Key: g.ClientKey}
	if self != nil {
		var err error
		if ca, err = pki.ParseCA(g.CA, g.CAKey); err != nil {
			return nc, nil, nil, err
		}
		if nodeCreds, err = issue(ca, pki.Identity{Role: pki.RoleNode, Name: t.node}); err != nil {
			return nc, nil, nil, err
		}
		if clientCreds, err = issue(ca, slurmboot.LaunchIdentity(t.node)); err != nil {
			return nc, nil, nil, err
		}
		caDir := filepath.Join(t.state, "ca")
		if err := os.MkdirAll(caDir, 0o700); err != nil {
			return nc, nil, nil, err
		}
		caFile, keyFile := filepath.Join(caDir, "ca.pem"), filepath.Join(caDir, "ca-key.pem")
		if err := pki.WriteSecret(caFile, g.CA); err != nil {
			return nc, nil, nil, err
		}
		if err := pki.WriteSecret(keyFile, g.CAKey); err != nil {
			return nc, nil, nil, err
		}
		cc2 := coordinator.DefaultConfig()
		cc2.Name, cc2.Listen, cc2.Logger = t.node, self.Addr, t.log
		if cc2.GossipTuning, err = gossip.Profile(t.f.gossipProfile); err != nil {
			return nc, nil, nil, fmt.Errorf("--gossip-profile: %w", err)
		}
		cc2.TLS.CA, cc2.TLSCAKey = caFile, keyFile
		cc2.Etcd.DataDir, cc2.Etcd.Name = filepath.Join(t.state, "etcd"), t.node
		cc2.Etcd.ClusterToken = "slurm-" + t.env.JobID + "." + t.env.StepID
		cc2.Etcd.DialTimeout = time.Minute
		for _, m := range g.Members {
			cc2.Etcd.Members = append(cc2.Etcd.Members, coordinator.EtcdMember{Name: m.Name, PeerURL: m.PeerURL})
		}
		u, _ := url.Parse(self.PeerURL)
		cc2.Etcd.PeerListen = u.Host
		nc.Coordinator = cc2
	}
	tc, err := pki.ClientTLS(clientCreds)
	if err != nil {
		return nc, nil, nil, err
	}
	agentTLS, err := pki.AgentTLS(clientCreds)
	if err != nil {
		return nc, nil, nil, err
	}
	nodeDir := filepath.Join(t.state, "node")
	if err := nodeCreds.Save(nodeDir); err != nil {
		return nc, nil, nil, err
	}
	exe, err := rankexe.Path()
	if err != nil {
		return nc, nil, nil, err
	}
	wc := worker.DefaultConfig()
	wc.Name, wc.Host, wc.GPUs = t.node, t.ip, int(spec.GpusPerNode)
	// Its own coordinator first, then the others in node order.
	for _, m := range g.Members {
		if m.Name == t.node {
			wc.Coordinators = append([]string{m.Addr}, wc.Coordinators...)
		} else {
			wc.Coordinators = append(wc.Coordinators, m.Addr)
		}
	}
	wc.TLS, wc.CredentialsDir = pki.DirFiles(nodeDir), filepath.Join(t.state, "credentials")
	wc.NativeCommand, wc.FenceCommand = []string{exe, rankCmd}, []string{exe, fenceCmd}
	wc.WorkDir, wc.Output, wc.Logger, wc.Version = filepath.Join(t.state, "work"), io.Discard, t.log, buildVersion()
	wc.CheckpointRoot = t.held
	// The ranks inherit the task's environment, as srun's own tasks do
	// (never gpucoord's variables, the step's secret among them).
	wc.RankEnv = []string{"*"}
	// The ranks' SIGTERM-to-SIGKILL grace, and the agent's own stop, fit
	// well within Slurm's KillWait, after which slurmstepd kills the task
	// before it removes its directories.
	wc.Grace = max(500*time.Millisecond, min(wc.Grace, t.killWait/4))
	if len(t.env.GPUs) >= int(spec.GpusPerNode) {
		wc.DeviceList = t.env.GPUs
	}
	nc.Agent = wc
	return nc, credentials.NewTLS(tc), agentTLS, nil
}

// takeOver unmutes this task's output once the tasks of every node before
// it are gone: their coordinators (each runs in its task's process) have
// been reached once and then refused or ignored a connection twice in a
// row, a second apart. It is then the first task left, and prints the job
// from there on (its steps and generations; the ranks' own lines stay with
// the first task). It returns when ctx ends or the job has ended. A node
// that is only cut off, or whose agent lost its lease, still runs its task
// and its coordinator: it is not taken over.
func (t *slurmTask) takeOver(ctx context.Context, job string, addrs []string, creds credentials.TransportCredentials, m *mutable, progress io.Writer) {
	cl, err := quietClient(addrs, creds)
	if err != nil {
		return
	}
	defer cl.Close()
	before := addrs[:t.env.NodeID] // the coordinators of the tasks before this one
	seen := make([]bool, len(before))
	goneFor := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cl.Status(sctx)
		cancel()
		if err == nil {
			for _, j := range st.Jobs {
				if j.GetSpec().GetId() == job && pb.Terminal(j.GetState()) {
					return // the tasks leave as the job ends: nothing to take over
				}
			}
		}
		gone := true
		for i, a := range before {
			c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", a)
			if err == nil {
				c.Close()
				seen[i] = true
			}
			gone = gone && seen[i] && err != nil
		}
		if goneFor = map[bool]int{true: goneFor + 1, false: 0}[gone]; goneFor < 2 {
			continue
		}
		m.unmute(func() {
			fmt.Fprintf(progress, "gpucoord: the tasks of %s are gone; %s's task follows the job from here (its last %d lines again first)\n",
				strings.Join(t.env.Nodes[:t.env.NodeID], ", "), t.node, replayLines)
		})
		return
	}
}

// mutable writers write nothing until unmuted, but keep the last
// replayLines writes; unmute replays them, so that the steps the first
// task may not have printed before it died are shown (a step shown twice
// is shown again with the same loss).
type mutable struct {
	mu     sync.Mutex
	on     bool
	recent []muted
}

type muted struct {
	w io.Writer
	b []byte
}

const replayLines = 64

func (m *mutable) unmute(notice func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	notice()
	for _, r := range m.recent {
		r.w.Write(r.b)
	}
	m.on, m.recent = true, nil
}

func (m *mutable) silent() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.on
}

func (m *mutable) wrap(w io.Writer) io.Writer { return mutedWriter{m, w} }

type mutedWriter struct {
	m *mutable
	w io.Writer
}

func (w mutedWriter) Write(b []byte) (int, error) {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	if w.m.on {
		return w.w.Write(b)
	}
	if len(w.m.recent) == replayLines {
		w.m.recent = append(w.m.recent[:0], w.m.recent[1:]...)
	}
	w.m.recent = append(w.m.recent, muted{w.w, append([]byte(nil), b...)})
	return len(b), nil
}

// cancel cancels the job with reason, trying for 10 s.
func (t *slurmTask) cancel(addrs []string, creds credentials.TransportCredentials, job, reason string) {
	cl, err := quietClient(addrs, creds)
	if err != nil {
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cl.Cancel(ctx, job, reason); err != nil {
		fmt.Fprintf(t.stderr, "gpucoord: cancelling job %s (%s): %v\n", job, reason, err)
	}
}

// resumeFromBackup makes a requeued run of the job (Slurm's restart
// count above 0) resume from the newest step its backup tier holds whole.
func (t *slurmTask) resumeFromBackup(spec *pb.JobSpec) {
	if !t.env.Requeued {
		return
	}
	if spec.CheckpointBackup == "" {
		fmt.Fprintf(t.stderr, "gpucoord: requeued (restart %d), and the job has no backup tier (--checkpoint-backup): it starts over\n", t.env.RestartCount)
		return
	}
	m, ok, err := ckpt.ReadBackupMark(worker.SharedCheckpointDir(spec.CheckpointBackup, spec.Id))
	switch {
	case err != nil:
		fmt.Fprintf(t.stderr, "gpucoord: requeued (restart %d): %v: the job starts over\n", t.env.RestartCount, err)
	case !ok:
		fmt.Fprintf(t.stderr, "gpucoord: requeued (restart %d): no step of the job in the backup tier yet: it starts over\n", t.env.RestartCount)
	default:
		spec.ResumeBackup = &pb.Step{Step: m.Step, Generation: m.Generation, Dp: m.Dp}
		fmt.Fprintf(t.stderr, "gpucoord: requeued (restart %d): resuming after step %d, from the backup tier\n", t.env.RestartCount, m.Step)
	}
}

// awaitAgentsGone waits, for at most most, until no agent is registered:
// a coordinator stays while others may still read the job's end through
// it, and stopping two of three etcd members would leave the third
// without a majority.
func (t *slurmTask) awaitAgentsGone(addrs []string, creds credentials.TransportCredentials, most time.Duration) {
	cl, err := quietClient(addrs, creds)
	if err != nil {
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), most)
	defer cancel()
	for ctx.Err() == nil {
		st, err := cl.Status(ctx)
		if err == nil && len(st.Nodes) == 0 {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// quietClient is a client of the step's coordinators that logs nothing:
// the task's own calls beside the follower (takeover, cancel, linger).
func quietClient(addrs []string, creds credentials.TransportCredentials) (*client.Client, error) {
	cfg := client.DefaultConfig()
	cfg.Coordinators, cfg.Credentials, cfg.Logger = addrs, creds, slog.New(slog.DiscardHandler)
	return client.New(cfg)
}

// slurmKillWait is slurm.conf's KillWait (SLURM_CONF, else
// /etc/slurm/slurm.conf), Slurm's default of 30 s when it says nothing.
func slurmKillWait() time.Duration {
	b, _ := os.ReadFile(cmp.Or(os.Getenv("SLURM_CONF"), "/etc/slurm/slurm.conf"))
	if n, err := strconv.Atoi(slurm.ConfValue(string(b), "KillWait")); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 30 * time.Second
}

// slurmSealer is MUNGE when its programs are installed, else the secret
// in GPUCOORD_SLURM_SECRET; with neither the tasks cannot trust each
// other, and launch says what to do.
func slurmSealer(socket string) (slurmboot.Sealer, error) {
	if s := os.Getenv(envSlurmSecret); s != "" {
		return slurmboot.Secret{Key: []byte(s), TTL: 5 * time.Minute, Now: time.Now}, nil
	}
	if _, err := exec.LookPath("munge"); err != nil {
		return nil, fmt.Errorf("the tasks of the step need MUNGE to trust each other (munge and unmunge are not installed here), or a secret they share: export %s=$(openssl rand -hex 32) before srun", envSlurmSecret)
	}
	if socket == "" {
		socket = slurmboot.MungeSocket(os.Getenv)
	}
	return slurmboot.Munge{Socket: socket, UID: os.Getuid()}, nil
}

// slurmAddress is the address of this task's node that the others reach:
// its name's, or, when that is loopback (Debian's 127.0.1.1), the one
// the route to another node of the step leaves from.
func slurmAddress(ctx context.Context, env slurm.Env) (string, error) {
	own, err := lookup(ctx, env.Nodes[env.NodeID])
	if err == nil && !net.ParseIP(own).IsLoopback() {
		return own, nil
	}
	for i, n := range env.Nodes {
		if i == env.NodeID {
			continue
		}
		peer, perr := lookup(ctx, n)
		if perr != nil {
			continue
		}
		c, derr := net.Dial("udp", net.JoinHostPort(peer, "9"))
		if derr != nil {
			continue
		}
		addr := c.LocalAddr().(*net.UDPAddr).IP.String()
		c.Close()
		return addr, nil
	}
	if err == nil {
		return own, nil // one node alone: loopback does
	}
	return "", fmt.Errorf("node %s: its address: %w", env.Nodes[env.NodeID], err)
}

// lookup resolves a node name to its first address, IPv4 first: by the
// resolver, else by the NodeAddr slurm.conf gives the node (scontrol show
// node), for clusters whose node names are no host names.
func lookup(ctx context.Context, name string) (string, error) {
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		out, serr := exec.CommandContext(ctx, "scontrol", "show", "node", "--oneliner", name).Output()
		addr := nodeAddr(string(out))
		if serr != nil || addr == "" || addr == name {
			return "", err
		}
		if net.ParseIP(addr) != nil {
			return addr, nil
		}
		if addrs, err = net.DefaultResolver.LookupHost(ctx, addr); err != nil {
			return "", err
		}
	}
	slices.SortStableFunc(addrs, func(a, b string) int {
		return boolInt(net.ParseIP(a).To4() == nil) - boolInt(net.ParseIP(b).To4() == nil)
	})
	return addrs[0], nil
}

// nodeAddr reads NodeAddr= from scontrol show node's output.
func nodeAddr(show string) string {
	for _, f := range strings.Fields(show) {
		if v, ok := strings.CutPrefix(f, "NodeAddr="); ok {
			return v
		}
	}
	return ""
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// freePorts returns n TCP ports free on ip a moment ago.
func freePorts(ip string, n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// issue makes credentials for id under ca.
func issue(ca *pki.CA, id pki.Identity) (pki.Credentials, error) {
	keyPEM, csr, err := pki.NewRequest(id)
	if err != nil {
		return pki.Credentials{}, err
	}
	certPEM, err := ca.SignRequest(csr, id, time.Now())
	if err != nil {
		return pki.Credentials{}, err
	}
	return pki.Credentials{CA: ca.PEM(), Cert: certPEM, Key: keyPEM}, nil
}
