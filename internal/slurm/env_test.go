package slurm

import (
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// srunStep is the environment of the second task of a typical 3-node srun
// step, one task and two GPUs a node.
var srunStep = map[string]string{
	"SLURM_JOB_ID":              "4242",
	"SLURM_STEP_ID":             "0",
	"SLURM_JOB_NODELIST":        "s[1-3]",
	"SLURM_JOB_NUM_NODES":       "3",
	"SLURM_STEP_NODELIST":       "s[1-3]",
	"SLURM_STEP_NUM_NODES":      "3",
	"SLURM_NODEID":              "1",
	"SLURM_PROCID":              "1",
	"SLURM_STEP_TASKS_PER_NODE": "1(x3)",
	"SLURM_GPUS_ON_NODE":        "2",
	"CUDA_VISIBLE_DEVICES":      "0,1",
}

// srunEnv is what Detect reads from srunStep.
var srunEnv = Env{
	JobID:        "4242",
	StepID:       "0",
	ProcID:       1,
	NodeID:       1,
	Nodes:        []string{"s1", "s2", "s3"},
	NNodes:       3,
	TasksPerNode: 1,
	GPUsOnNode:   2,
	GPUs:         []string{"0", "1"},
}

// batchScript is the environment of an sbatch script: a job, no step.
var batchScript = map[string]string{
	"SLURM_JOB_ID":         "4242",
	"SLURM_JOB_NODELIST":   "s[1-3]",
	"SLURM_JOB_NUM_NODES":  "3",
	"SLURM_NNODES":         "3",
	"SLURM_NODEID":         "0",
	"SLURM_PROCID":         "0",
	"SLURM_TASKS_PER_NODE": "1(x3)",
}

// with returns a copy of base with the variables in kv set (to "" to
// unset them: getenv cannot tell the two apart).
func with(base map[string]string, kv ...string) map[string]string {
	m := maps.Clone(base)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(m, kv[i])
		} else {
			m[kv[i]] = kv[i+1]
		}
	}
	return m
}

// change returns a copy of srunEnv changed by f.
func change(f func(*Env)) Env {
	e := srunEnv
	e.Nodes = slices.Clone(e.Nodes)
	e.GPUs = slices.Clone(e.GPUs)
	f(&e)
	return e
}

// detectCase is a case of TestDetect.
type detectCase struct {
	name    string
	mode    Mode
	env     map[string]string
	want    Env
	wantOK  bool
	wantErr error    // to match with errors.Is
	errHas  []string // in the error message; none when Detect must succeed
}

func TestDetect(t *testing.T) {
	tests := []detectCase{
		{name: "srun step, auto", mode: ModeAuto, env: srunStep, want: srunEnv, wantOK: true},
		{name: "srun step, on", mode: ModeOn, env: srunStep, want: srunEnv, wantOK: true},
		{name: "srun step, off", mode: ModeOff, env: srunStep},
		{name: "off ignores malformed values", mode: ModeOff, env: with(srunStep, "SLURM_PROCID", "x")},
		{name: "batch script, auto", mode: ModeAuto, env: batchScript},
		{name: "batch script, on", mode: ModeOn, env: batchScript, wantErr: ErrNotInStep,
			errHas: []string{"SLURM_STEP_ID is unset", "srun"}},
		{name: "no Slurm, auto", mode: ModeAuto, env: map[string]string{}},
		{name: "no Slurm, on", mode: ModeOn, env: map[string]string{}, wantErr: ErrNotInStep,
			errHas: []string{"SLURM_JOB_ID and SLURM_STEP_ID unset"}},
		{name: "step id without job id, on", mode: ModeOn, env: with(srunStep, "SLURM_JOB_ID", ""), wantErr: ErrNotInStep,
			errHas: []string{"SLURM_JOB_ID unset"}},
		{name: "step id without job id, auto", mode: ModeAuto, env: with(srunStep, "SLURM_JOB_ID", "")},
		{name: "unknown mode", mode: "yes", env: srunStep, errHas: []string{`mode "yes"`}},
		{name: "empty mode", mode: "", env: srunStep, errHas: []string{`mode ""`}},

		{name: "requeued", mode: ModeAuto, env: with(srunStep, "SLURM_RESTART_COUNT", "2"), wantOK: true,
			want: change(func(e *Env) { e.RestartCount, e.Requeued = 2, true })},
		{name: "restart count 0", mode: ModeAuto, env: with(srunStep, "SLURM_RESTART_COUNT", "0"), wantOK: true, want: srunEnv},
		{name: "no kill", mode: ModeAuto, env: with(srunStep, "SLURM_NO_KILL", "1"), wantOK: true,
			want: change(func(e *Env) { e.NoKill = true })},
		{name: "GPUs from CUDA_VISIBLE_DEVICES only", mode: ModeAuto,
			env: with(srunStep, "SLURM_GPUS_ON_NODE", "", "CUDA_VISIBLE_DEVICES", "0,1,2,3"), wantOK: true,
			want: change(func(e *Env) { e.GPUsOnNode, e.GPUs = 4, []string{"0", "1", "2", "3"} })},
		{name: "GPU UUIDs", mode: ModeAuto,
			env: with(srunStep, "SLURM_GPUS_ON_NODE", "", "CUDA_VISIBLE_DEVICES", "GPU-8a1f,GPU-77c0"), wantOK: true,
			want: change(func(e *Env) { e.GPUsOnNode, e.GPUs = 2, []string{"GPU-8a1f", "GPU-77c0"} })},
		{name: "SLURM_GPUS_ON_NODE without CUDA_VISIBLE_DEVICES", mode: ModeAuto,
			env: with(srunStep, "CUDA_VISIBLE_DEVICES", ""), wantOK: true,
			want: change(func(e *Env) { e.GPUs = nil })},
		{name: "no GPUs", mode: ModeAuto, env: with(srunStep, "SLURM_GPUS_ON_NODE", "", "CUDA_VISIBLE_DEVICES", ""), wantOK: true,
			want: change(func(e *Env) { e.GPUsOnNode, e.GPUs = 0, nil })},
		{name: "NoDevFiles", mode: ModeAuto, env: with(srunStep, "SLURM_GPUS_ON_NODE", "", "CUDA_VISIBLE_DEVICES", "NoDevFiles"), wantOK: true,
			want: change(func(e *Env) { e.GPUsOnNode, e.GPUs = 0, nil })},
		{name: "job node list when the step's is unset", mode: ModeAuto,
			env:    with(srunStep, "SLURM_STEP_NODELIST", "", "SLURM_STEP_NUM_NODES", "", "SLURM_JOB_NODELIST", "", "SLURM_NODELIST", "gpu[07-08,10]", "SLURM_NNODES", "3"),
			wantOK: true, want: change(func(e *Env) { e.Nodes = []string{"gpu07", "gpu08", "gpu10"} })},
		{name: "node count from the list", mode: ModeAuto,
			env:    with(srunStep, "SLURM_STEP_NUM_NODES", "", "SLURM_JOB_NUM_NODES", ""),
			wantOK: true, want: srunEnv},
		{name: "tasks per node from the job", mode: ModeAuto,
			env:    with(srunStep, "SLURM_STEP_TASKS_PER_NODE", "", "SLURM_TASKS_PER_NODE", "4,2(x2)"),
			wantOK: true, want: change(func(e *Env) { e.TasksPerNode = 4 })},
		{name: "no tasks per node", mode: ModeAuto, env: with(srunStep, "SLURM_STEP_TASKS_PER_NODE", ""),
			wantOK: true, want: change(func(e *Env) { e.TasksPerNode = 0 })},
		{name: "one node", mode: ModeOn,
			env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3", "SLURM_STEP_NODELIST": "login1",
				"SLURM_STEP_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "5", "SLURM_STEP_TASKS_PER_NODE": "8"},
			wantOK: true, want: Env{JobID: "7", StepID: "3", ProcID: 5, Nodes: []string{"login1"}, NNodes: 1, TasksPerNode: 8}},

		{name: "NodeID past the last node", mode: ModeAuto, env: with(srunStep, "SLURM_NODEID", "3"), wantErr: ErrBadEnv,
			errHas: []string{"SLURM_NODEID=3", "3 nodes"}},
		{name: "more nodes counted than listed", mode: ModeAuto, env: with(srunStep, "SLURM_STEP_NUM_NODES", "4"), wantErr: ErrBadEnv,
			errHas: []string{`SLURM_STEP_NODELIST="s[1-3]" names 3 nodes`, `SLURM_STEP_NUM_NODES="4"`}},
		{name: "job's node count against the step's list", mode: ModeAuto,
			env: with(srunStep, "SLURM_STEP_NUM_NODES", "", "SLURM_STEP_NODELIST", "s[1-2]", "SLURM_NODEID", "0"), wantErr: ErrBadEnv,
			errHas: []string{`SLURM_STEP_NODELIST="s[1-2]" names 2 nodes`, `SLURM_JOB_NUM_NODES="3"`}},
		{name: "no SLURM_PROCID", mode: ModeAuto, env: with(srunStep, "SLURM_PROCID", ""), wantErr: ErrBadEnv,
			errHas: []string{"SLURM_PROCID is unset"}},
		{name: "no SLURM_NODEID", mode: ModeAuto, env: with(srunStep, "SLURM_NODEID", ""), wantErr: ErrBadEnv,
			errHas: []string{"SLURM_NODEID is unset"}},
		{name: "no node list", mode: ModeAuto, env: with(srunStep, "SLURM_STEP_NODELIST", "", "SLURM_JOB_NODELIST", ""), wantErr: ErrBadEnv,
			errHas: []string{"no node list"}},
		{name: "malformed node list", mode: ModeAuto, env: with(srunStep, "SLURM_STEP_NODELIST", "s[1-3"), wantErr: ErrBadHostlist,
			errHas: []string{"SLURM_STEP_NODELIST", `"s[1-3"`, "never closed"}},
	}
	malformed := []struct{ name, value string }{
		{"SLURM_PROCID", "x"},
		{"SLURM_PROCID", "-1"},
		{"SLURM_PROCID", "+1"},
		{"SLURM_PROCID", " 1"},
		{"SLURM_PROCID", "99999999999999999999"},
		{"SLURM_NODEID", "1.0"},
		{"SLURM_STEP_NUM_NODES", "three"},
		{"SLURM_STEP_TASKS_PER_NODE", "1(x3"},
		{"SLURM_STEP_TASKS_PER_NODE", "(x3)"},
		{"SLURM_STEP_TASKS_PER_NODE", "0"},
		{"SLURM_STEP_TASKS_PER_NODE", "1(x0)"},
		{"SLURM_STEP_TASKS_PER_NODE", "1(x3)x"},
		{"SLURM_STEP_TASKS_PER_NODE", "1(x3),"},
		{"SLURM_STEP_TASKS_PER_NODE", "2,x"},
		{"SLURM_GPUS_ON_NODE", "two"},
		{"SLURM_RESTART_COUNT", "-1"},
		{"CUDA_VISIBLE_DEVICES", "0,,1"},
		{"CUDA_VISIBLE_DEVICES", "0,"},
	}
	for _, m := range malformed {
		tests = append(tests, detectCase{name: "malformed " + m.name + "=" + m.value, mode: ModeAuto, env: with(srunStep, m.name, m.value),
			wantErr: ErrBadEnv, errHas: []string{m.name + `="` + m.value + `"`}})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := Detect(tc.mode, func(k string) string { return tc.env[k] })
			if len(tc.errHas) > 0 {
				if err == nil {
					t.Fatalf("Detect = %+v, %v, nil; want an error", got, ok)
				}
				if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Errorf("error %v, want one wrapping %v", err, tc.wantErr)
				}
				for _, s := range tc.errHas {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q lacks %q", err, s)
					}
				}
				if ok || !reflect.DeepEqual(got, Env{}) {
					t.Errorf("Detect = %+v, %v with its error; want Env{}, false", got, ok)
				}
				return
			}
			if err != nil {
				t.Fatalf("Detect: %v", err)
			}
			if ok != tc.wantOK || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Detect = %+v, %v\nwant     %+v, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	tests := []struct {
		in      string
		want    Mode
		wantErr bool
	}{
		{"auto", ModeAuto, false},
		{"on", ModeOn, false},
		{"off", ModeOff, false},
		{"", "", true},
		{"On", "", true},
		{"true", "", true},
	}
	for _, tc := range tests {
		got, err := ParseMode(tc.in)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("ParseMode(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "auto, on or off") {
			t.Errorf("ParseMode(%q): error %q does not list the modes", tc.in, err)
		}
	}
}

func TestFirstNodes(t *testing.T) {
	e := Env{Nodes: []string{"s1", "s2", "s3"}, NNodes: 3}
	tests := []struct {
		k    int
		want []string
	}{
		{-1, []string{}},
		{0, []string{}},
		{1, []string{"s1"}},
		{2, []string{"s1", "s2"}},
		{3, []string{"s1", "s2", "s3"}},
		{5, []string{"s1", "s2", "s3"}},
	}
	for _, tc := range tests {
		got := e.FirstNodes(tc.k)
		if !slices.Equal(got, tc.want) {
			t.Errorf("FirstNodes(%d) = %q, want %q", tc.k, got, tc.want)
		}
		if len(got) > 0 {
			got[0] = "changed"
			if e.Nodes[0] != "s1" {
				t.Fatalf("FirstNodes(%d) shares its slice with Env.Nodes", tc.k)
			}
		}
	}
	if got := (Env{}).FirstNodes(2); len(got) != 0 {
		t.Errorf("Env{}.FirstNodes(2) = %q, want none", got)
	}
}

func TestConfValue(t *testing.T) {
	conf := "ClusterName=box\n# KillWait=99\nkillwait=5 # seconds\nNodeName=h2 NodeAddr=10.0.0.2 CPUs=4\nSlurmdTimeout=5\n"
	for key, want := range map[string]string{"KillWait": "5", "SlurmdTimeout": "5", "NodeAddr": "10.0.0.2", "MessageTimeout": ""} {
		if got := ConfValue(conf, key); got != want {
			t.Errorf("ConfValue(%s) = %q, want %q", key, got, want)
		}
	}
}
