package worker

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpucoord/gpucoord/collectives/nccl"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/topology"
)

// Env variables a rank's program gets beyond torchrun's.
const (
	EnvPlan = "GPUCOORD_PLAN"
	// EnvGroups names the generation's process groups file (GroupsFile):
	// every TP, PP and DP group as lists of global ranks, as
	// topology.Layout lays them out, for a program to build its process
	// groups from (examples/pytorch/gpucoord_groups.py).
	EnvGroups        = "GPUCOORD_GROUPS"
	EnvCheckpointDir = "GPUCOORD_CHECKPOINT_DIR"
	// EnvResumeStep is the committed step the generation resumes after:
	// its files are under GPUCOORD_CHECKPOINT_DIR/<step> (0: from the
	// beginning).
	EnvResumeStep = "GPUCOORD_RESUME_STEP"
	// EnvHost is the address other nodes reach this rank's node at.
	EnvHost = "GPUCOORD_HOST"
	// EnvBindHost is the local address the rank's listeners bind.
	EnvBindHost = "GPUCOORD_BIND_HOST"
)

// NodeEnv is what a rank's environment says of the node it runs on.
type NodeEnv struct {
	// Name is the node's name.
	Name string
	// Network is how the node is reached: its advertised and bound
	// addresses and its interface.
	Network
	// Devices adds CUDA_VISIBLE_DEVICES with the local rank.
	Devices bool
	// DeviceList, when set, gives local rank i CUDA_VISIBLE_DEVICES=the
	// i-th.
	DeviceList []string
}

// InheritedEnv lists the variables of the agent's own environment that its
// ranks inherit: what a program needs to find its tools, libraries, locale
// and temporary space, and the settings an operator gives CUDA, NCCL,
// gloo, PyTorch, Python and the math libraries. A name ending in '*'
// stands for every variable that starts with what comes before it.
// Nothing else of the agent's environment reaches a rank: not its join
// token (GPUCOORD_TOKEN), nor any variable the agent reads for itself.
// Worker flag --rank-env adds names (Config.RankEnv); a job's own
// variables (its spec's env) are always set.
var InheritedEnv = []string{
	"PATH", "HOME", "USER", "LOGNAME", "SHELL", "HOSTNAME", "TERM", "TZ", "LANG", "LANGUAGE", "LC_*", "TMPDIR",
	"LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHON*", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
	"XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
	"CUDA_*", "NVIDIA_*", "NCCL_*", "GLOO_*", "UCX_*", "FI_*", "TORCH*", "OMP_*", "MKL_*", "KMP_*", "OPENBLAS_*",
	"GOMAXPROCS", "GOMEMLIMIT", "GOGC", "GODEBUG", "GOTRACEBACK", "GORACE",
	nccl.EnvNCCLLibrary, nccl.EnvCUDARTLibrary, // read by native ranks, which load NCCL
	"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR",
}

// agentOnlyPrefix marks the variables gpucoord reads for itself: none
// reaches a rank from the agent's environment, whatever --rank-env says,
// but for the libraries a native rank loads (InheritedEnv names them).
const agentOnlyPrefix = "GPUCOORD_"

// matchEnv reports whether the variable name is one of patterns (NAME, or
// PREFIX* for every name starting with PREFIX).
func matchEnv(name string, patterns []string) bool {
	for _, p := range patterns {
		if pre, ok := strings.CutSuffix(p, "*"); ok && strings.HasPrefix(name, pre) || p == name {
			return true
		}
	}
	return false
}

// inheritedEnv is the part of environ (KEY=VALUE, as os.Environ gives it)
// a rank inherits: InheritedEnv's variables and extra's, never one the
// agent reads for itself but the libraries InheritedEnv names.
func inheritedEnv(environ, extra []string) []string {
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "":
		case matchEnv(k, InheritedEnv) && (!strings.HasPrefix(k, agentOnlyPrefix) || slices.Contains(InheritedEnv, k)):
			out = append(out, kv)
		case matchEnv(k, extra) && !strings.HasPrefix(k, agentOnlyPrefix):
			out = append(out, kv)
		}
	}
	return out
}

// CheckRankEnv refuses a --rank-env pattern that cannot work: empty, with
// '=', a '*' anywhere but at its end, or one that would pass the agent's
// own variables (GPUCOORD_*) by name or by a prefix of theirs. "*" alone,
// every variable but gpucoord's own, is for an agent whose environment is
// its user's (launch --standalone).
func CheckRankEnv(p string) error {
	if p == "*" {
		return nil
	}
	pre, star := strings.CutSuffix(p, "*")
	if pre == "" || strings.ContainsAny(pre, "=*\x00") || star && strings.HasPrefix(agentOnlyPrefix, pre) || strings.HasPrefix(pre, agentOnlyPrefix) {
		return fmt.Errorf("--rank-env %q: want a variable name, or a prefix ending in '*', that names none of gpucoord's own (%s*)", p, agentOnlyPrefix)
	}
	return nil
}

// socketIfaceVars are the variables that tell gloo and NCCL which
// interface to use; the agent sets them to its own unless the user did.
var socketIfaceVars = []string{"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}

// layout returns the assignment's rank layout: TP and PP as the job asked,
// DP as the coordinator resolved it for this generation.
// groupsFile is the name of the process groups file beside the plan file.
const groupsFile = "groups.json"

// GroupsFile is the content of GPUCOORD_GROUPS.
type GroupsFile struct {
	// TP, PP and DP are the degrees, and Order the rank order (fastest
	// axis first).
	TP    int    `json:"tp"`
	PP    int    `json:"pp"`
	DP    int    `json:"dp"`
	Order string `json:"order"`
	// Groups are every group of each axis, each ordered by group rank.
	Groups topology.Groups `json:"groups"`
}

// writeGroups writes the generation's process groups file into dir.
func writeGroups(dir string, a *pb.Assignment, l topology.Layout) error {
	b, err := json.MarshalIndent(GroupsFile{TP: l.TP, PP: l.PP, DP: l.DP, Order: cmp.Or(a.Spec.GetOrder(), topology.DefaultOrder), Groups: l.Groups()}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, groupsFile), b, 0o644)
}

func layout(a *pb.Assignment) (topology.Layout, error) {
	g := pb.GenerationGrid(a.Spec, a.Generation)
	return topology.NewLayout(int(g.TP), int(g.PP), int(a.Generation.GetDp()), a.Spec.GetOrder())
}

// member returns node's place in the assignment's generation (its view
// holds the node and a few others).
func member(a *pb.Assignment, node string) *pb.Member {
	for _, m := range a.Generation.GetMembers() {
		if m.Node == node {
			return m
		}
	}
	return nil
}

// RankEnv returns the environment of global rank r on node: torchrun's
// contract, so that a program written for torchrun runs unchanged, and
// gpucoord's own (its coordinates, the plan file, the checkpoint
// directory, the node's addresses). gloo and NCCL are pointed at the
// node's interface unless the agent's environment or the job's names one.
func RankEnv(a *pb.Assignment, node NodeEnv, r int, planPath, ckptDir string) ([]string, error) {
	l, err := layout(a)
	if err != nil {
		return nil, err
	}
	m := member(a, node.Name)
	if m == nil {
		return nil, fmt.Errorf("node %s is not in generation %d of job %s", node.Name, a.Generation.GetNumber(), a.Job)
	}
	host, port, err := net.SplitHostPort(a.Master)
	if err != nil {
		return nil, fmt.Errorf("job %s: master address %q: %v", a.Job, a.Master, err)
	}
	c := l.Coord(topology.Rank(r))
	restarts := strconv.FormatInt(a.Generation.GetNumber()-1, 10)
	itoa := strconv.Itoa
	env := []string{
		"RANK=" + itoa(r),
		"LOCAL_RANK=" + itoa(r-int(m.FirstRank)),
		"WORLD_SIZE=" + itoa(l.World()),
		"LOCAL_WORLD_SIZE=" + itoa(int(m.Ranks)),
		"GROUP_RANK=" + itoa(int(a.GroupRank)),
		"GROUP_WORLD_SIZE=" + itoa(int(a.GroupWorld)),
		"ROLE_NAME=default",
		"ROLE_RANK=" + itoa(r),
		"ROLE_WORLD_SIZE=" + itoa(l.World()),
		"MASTER_ADDR=" + host,
		"MASTER_PORT=" + port,
		"TORCHELASTIC_RESTART_COUNT=" + restarts,
		"TORCHELASTIC_MAX_RESTARTS=" + itoa(int(a.Spec.GetMaxRestarts())),
		"TORCHELASTIC_RUN_ID=" + a.Job,
		"TORCHELASTIC_USE_AGENT_STORE=False",
		"GPUCOORD_TP_RANK=" + itoa(c.TP), "GPUCOORD_TP_SIZE=" + itoa(l.TP),
		"GPUCOORD_PP_RANK=" + itoa(c.PP), "GPUCOORD_PP_SIZE=" + itoa(l.PP),
		"GPUCOORD_DP_RANK=" + itoa(c.DP), "GPUCOORD_DP_SIZE=" + itoa(l.DP),
		"GPUCOORD_ZERO_STAGE=" + itoa(int(pb.GenerationGrid(a.Spec, a.Generation).Zero)),
		"GPUCOORD_GENERATION=" + strconv.FormatInt(a.Generation.GetNumber(), 10),
		"GPUCOORD_RESTART_COUNT=" + restarts,
		EnvPlan + "=" + planPath,
		EnvGroups + "=" + filepath.Join(filepath.Dir(planPath), groupsFile),
		EnvCheckpointDir + "=" + ckptDir,
		EnvResumeStep + "=" + strconv.FormatInt(a.Generation.GetResumeStep(), 10),
		EnvHost + "=" + node.Host,
		EnvBindHost + "=" + node.Bind,
	}
	if node.Iface != "" {
		for _, k := range socketIfaceVars {
			if _, set := os.LookupEnv(k); !set && a.Spec.GetEnv()[k] == "" {
				env = append(env, k+"="+node.Iface)
			}
		}
	}
	switch local := r - int(m.FirstRank); {
	case local < len(node.DeviceList):
		env = append(env, "CUDA_VISIBLE_DEVICES="+node.DeviceList[local])
	case node.Devices:
		env = append(env, "CUDA_VISIBLE_DEVICES="+itoa(local))
	}
	for k, v := range a.Spec.GetEnv() {
		env = append(env, k+"="+v)
	}
	return env, nil
}

// prefix is the tag of rank r's output lines: "[node1 r5 tp1 pp0 dp2] ".
func prefix(node string, r int, l topology.Layout) string {
	c := l.Coord(topology.Rank(r))
	return fmt.Sprintf("[%s r%d tp%d pp%d dp%d] ", node, r, c.TP, c.PP, c.DP)
}
