package slurm

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ErrNotInStep is wrapped by Detect's error under ModeOn when the process
// is not a task of a Slurm step: SLURM_JOB_ID or SLURM_STEP_ID is unset.
var ErrNotInStep = errors.New("slurm: not a task of a Slurm step")

// ErrBadEnv is wrapped by Detect's errors for a step's environment that
// cannot be used: a variable that is missing or malformed, or variables
// that disagree. The message names the variables and their values.
var ErrBadEnv = errors.New("slurm: bad step environment")

// Env is what a task of a Slurm step learns from its environment.
type Env struct {
	// JobID is SLURM_JOB_ID.
	JobID string
	// StepID is SLURM_STEP_ID.
	StepID string
	// ProcID is SLURM_PROCID: the task's rank in the step.
	ProcID int
	// NodeID is SLURM_NODEID: the index of the task's node in Nodes.
	NodeID int
	// Nodes is SLURM_STEP_NODELIST expanded, else SLURM_JOB_NODELIST or
	// SLURM_NODELIST: the step's nodes in Slurm's order.
	Nodes []string
	// NNodes is SLURM_STEP_NUM_NODES, else SLURM_NNODES or
	// SLURM_JOB_NUM_NODES, else len(Nodes); Detect checks that it is
	// len(Nodes).
	NNodes int
	// TasksPerNode is the task count of the first entry of
	// SLURM_STEP_TASKS_PER_NODE, else SLURM_TASKS_PER_NODE ("1(x3)" gives
	// 1, "2,1" gives 2); 0 when neither is set.
	TasksPerNode int
	// GPUsOnNode is SLURM_GPUS_ON_NODE, else len(GPUs).
	GPUsOnNode int
	// GPUs is CUDA_VISIBLE_DEVICES split at commas: indices or UUIDs as
	// written; nil when it is unset, empty or Slurm's "NoDevFiles".
	GPUs []string
	// RestartCount is SLURM_RESTART_COUNT: how many times the job was
	// requeued (0 when unset).
	RestartCount int
	// NoKill is whether SLURM_NO_KILL is set, to any non-empty value: the
	// job was submitted with --no-kill and outlives the loss of a node.
	NoKill bool
	// Requeued is RestartCount > 0: this run of the job is not its first.
	Requeued bool
}

// Mode says whether gpucoord reads a Slurm step's environment: the value
// of --slurm.
type Mode string

const (
	// ModeAuto reads the environment of a Slurm step when the process is a
	// task of one, and ignores Slurm otherwise.
	ModeAuto Mode = "auto"
	// ModeOn requires the process to be a task of a Slurm step.
	ModeOn Mode = "on"
	// ModeOff ignores Slurm's variables even when they are set.
	ModeOff Mode = "off"
)

// ParseMode returns the Mode named s: "auto", "on" or "off".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeOn, ModeOff:
		return m, nil
	}
	return "", fmt.Errorf("slurm: mode %q: want auto, on or off", s)
}

// Detect reads the environment through getenv (os.Getenv in production;
// an unset variable and an empty one read alike).
//
// Under ModeAuto the process is a task of a Slurm step when SLURM_JOB_ID
// and SLURM_STEP_ID are both set: srun sets both, while a batch script or
// an salloc shell has only the first. Under ModeOn it must be, and Detect
// returns an error wrapping ErrNotInStep that names the missing variables.
// Under ModeOff it never is.
//
// Detect returns (env, true, nil) for a task of a step and (Env{}, false,
// nil) otherwise. Within a step it returns an error wrapping ErrBadEnv for
// a missing SLURM_PROCID, SLURM_NODEID or node list, for a malformed value
// (naming the variable and the value), for a node list whose length is not
// the node count, and for a NodeID outside [0, NNodes).
func Detect(mode Mode, getenv func(string) string) (Env, bool, error) {
	switch mode {
	case ModeOff:
		return Env{}, false, nil
	case ModeAuto, ModeOn:
	default:
		return Env{}, false, fmt.Errorf("slurm: mode %q: want auto, on or off", mode)
	}
	var missing []string
	for _, name := range []string{"SLURM_JOB_ID", "SLURM_STEP_ID"} {
		if getenv(name) == "" {
			missing = append(missing, name)
		}
	}
	switch {
	case len(missing) == 0:
	case mode == ModeAuto:
		return Env{}, false, nil
	case len(missing) == 1 && missing[0] == "SLURM_STEP_ID":
		return Env{}, false, fmt.Errorf("%w: --slurm=on but SLURM_STEP_ID is unset: this is a batch script or an salloc shell, not a task; start gpucoord with srun", ErrNotInStep)
	default:
		return Env{}, false, fmt.Errorf("%w: --slurm=on but %s unset", ErrNotInStep, strings.Join(missing, " and "))
	}
	e, err := readStep(getenv)
	if err != nil {
		return Env{}, false, err
	}
	return e, true, nil
}

// readStep reads the environment of a task of a step, once Detect has
// seen SLURM_JOB_ID and SLURM_STEP_ID.
func readStep(getenv func(string) string) (Env, error) {
	e := Env{JobID: getenv("SLURM_JOB_ID"), StepID: getenv("SLURM_STEP_ID")}
	var err error
	if e.ProcID, err = required(getenv, "SLURM_PROCID"); err != nil {
		return Env{}, err
	}
	if e.NodeID, err = required(getenv, "SLURM_NODEID"); err != nil {
		return Env{}, err
	}

	listVar, list := first(getenv, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
	if listVar == "" {
		return Env{}, fmt.Errorf("%w: no node list: SLURM_STEP_NODELIST, SLURM_JOB_NODELIST and SLURM_NODELIST are unset", ErrBadEnv)
	}
	if e.Nodes, err = ExpandHostlist(list); err != nil {
		return Env{}, fmt.Errorf("%w: %s: %w", ErrBadEnv, listVar, err)
	}
	e.NNodes = len(e.Nodes)
	if countVar, count := first(getenv, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"); countVar != "" {
		if e.NNodes, err = number(countVar, count); err != nil {
			return Env{}, err
		}
		if e.NNodes != len(e.Nodes) {
			return Env{}, fmt.Errorf("%w: %s=%q names %d nodes but %s=%q", ErrBadEnv, listVar, list, len(e.Nodes), countVar, count)
		}
	}
	if e.NodeID >= e.NNodes {
		return Env{}, fmt.Errorf("%w: SLURM_NODEID=%d is outside the step's %d nodes", ErrBadEnv, e.NodeID, e.NNodes)
	}

	if name, v := first(getenv, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"); name != "" {
		if e.TasksPerNode, err = tasksPerNode(name, v); err != nil {
			return Env{}, err
		}
	}
	if e.GPUs, err = visibleDevices(getenv("CUDA_VISIBLE_DEVICES")); err != nil {
		return Env{}, err
	}
	e.GPUsOnNode = len(e.GPUs)
	if v := getenv("SLURM_GPUS_ON_NODE"); v != "" {
		if e.GPUsOnNode, err = number("SLURM_GPUS_ON_NODE", v); err != nil {
			return Env{}, err
		}
	}
	if v := getenv("SLURM_RESTART_COUNT"); v != "" {
		if e.RestartCount, err = number("SLURM_RESTART_COUNT", v); err != nil {
			return Env{}, err
		}
	}
	e.Requeued = e.RestartCount > 0
	e.NoKill = getenv("SLURM_NO_KILL") != ""
	return e, nil
}

// FirstNodes returns the first min(k, len(e.Nodes)) nodes of the step,
// where the coordinators run; none when k <= 0. The slice is the caller's.
func (e Env) FirstNodes(k int) []string {
	return slices.Clone(e.Nodes[:max(0, min(k, len(e.Nodes)))])
}

// first returns the first of names that getenv reports set, and its value;
// "", "" when none is.
func first(getenv func(string) string, names ...string) (name, value string) {
	for _, n := range names {
		if v := getenv(n); v != "" {
			return n, v
		}
	}
	return "", ""
}

// required reads the non-negative integer in the variable name, which must
// be set.
func required(getenv func(string) string, name string) (int, error) {
	v := getenv(name)
	if v == "" {
		return 0, fmt.Errorf("%w: %s is unset", ErrBadEnv, name)
	}
	return number(name, v)
}

// number parses v, the value of the variable name, as a non-negative
// decimal integer: digits only, no sign or spaces.
func number(name, v string) (int, error) {
	n, ok := digits(v)
	if !ok {
		return 0, fmt.Errorf("%w: %s=%q is not a non-negative integer", ErrBadEnv, name, v)
	}
	return n, nil
}

// digits parses s when it is a non-empty run of decimal digits that fits
// an int.
func digits(s string) (int, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// tasksPerNode returns the task count of the first entry of v, the value
// of the variable name, after checking every entry: Slurm writes the
// counts of the nodes in order, "N(xM)" for M nodes running N tasks each,
// as in "2(x3),1".
func tasksPerNode(name, v string) (int, error) {
	bad := func() (int, error) {
		return 0, fmt.Errorf("%w: %s=%q is not a list of task counts such as \"2(x3),1\"", ErrBadEnv, name, v)
	}
	firstCount := 0
	for i, entry := range strings.Split(v, ",") {
		count, repeat, repeated := strings.Cut(entry, "(x")
		n, ok := digits(count)
		if !ok || n == 0 {
			return bad()
		}
		if repeated {
			m, ok := digits(strings.TrimSuffix(repeat, ")"))
			if !ok || m == 0 || !strings.HasSuffix(repeat, ")") {
				return bad()
			}
		}
		if i == 0 {
			firstCount = n
		}
	}
	return firstCount, nil
}

// visibleDevices splits CUDA_VISIBLE_DEVICES. Slurm sets it to
// "NoDevFiles" when the job has GPUs whose device files it does not know;
// that names no device.
func visibleDevices(v string) ([]string, error) {
	if v == "" || v == "NoDevFiles" {
		return nil, nil
	}
	devs := strings.Split(v, ",")
	if slices.Contains(devs, "") {
		return nil, fmt.Errorf("%w: CUDA_VISIBLE_DEVICES=%q has an empty entry", ErrBadEnv, v)
	}
	return devs, nil
}

// ConfValue returns the value slurm.conf's text conf gives key (matched
// as Slurm does, in any case), "" when it gives none; comments ('#' to the
// end of the line) are ignored.
func ConfValue(conf, key string) string {
	value := ""
	for line := range strings.Lines(conf) {
		line, _, _ = strings.Cut(line, "#")
		for field := range strings.FieldsSeq(line) {
			if k, v, ok := strings.Cut(field, "="); ok && strings.EqualFold(k, key) {
				value = v // the last one counts
			}
		}
	}
	return value
}
