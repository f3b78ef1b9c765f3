package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/gpucoord/gpucoord/coordinator"
	"github.com/gpucoord/gpucoord/topology"
	"github.com/gpucoord/gpucoord/worker/engine"
)

// webPlan answers the dashboard's plan form (coordinator.PlanFunc) with
// plan itself, run here with --json and --svg: the numbers are plan
// --json's, the picture plan --svg's. Clusters and models are presets
// only: a file on the coordinator's machine is not a caller's to read. A
// job file's replan section names the model (and cluster) as launch's
// --plan-model does; the flags name the rest.
func webPlan(ctx context.Context, args []string, job []byte) (*coordinator.PlanAnswer, error) {
	refuse := func(format string, a ...any) (*coordinator.PlanAnswer, error) {
		return &coordinator.PlanAnswer{Command: planLine(args), Error: fmt.Sprintf(format, a...)}, nil
	}
	args = slices.Clone(args)
	check := newPlanCmd()
	fl := check.Flags()
	if err := fl.Parse(args); err != nil {
		return refuse("%v", err)
	}
	if len(fl.Args()) > 0 {
		return refuse("plan takes flags only, not %q", fl.Args()[0])
	}
	for _, name := range []string{"json", "svg", "auto", "failures", "top"} {
		if fl.Changed(name) {
			return refuse("--%s is not for the dashboard's form (gpucoord plan --%s runs it)", name, name)
		}
	}
	if len(bytes.TrimSpace(job)) > 0 {
		j, err := engine.ParseJob(bytes.NewReader(job), nil)
		if err != nil {
			return refuse("the job file: %v", err)
		}
		if j.Replan == nil || j.Replan.Model == "" {
			return refuse("the job file names no model to plan: its replan section's model (a plan --model preset, as launch --plan-model) is what plan lays out")
		}
		if !fl.Changed("model") {
			args = append(args, "--model", j.Replan.Model)
		}
		if j.Replan.Cluster != "" && !fl.Changed("cluster") {
			args = append(args, "--cluster", j.Replan.Cluster)
		}
		if err := fl.Parse(args); err != nil {
			return refuse("%v", err)
		}
	}
	for _, p := range []struct {
		flag  string
		known []string
	}{{"cluster", topology.ClusterPresets()}, {"model", topology.ModelPresets()}} {
		if v := fl.Lookup(p.flag).Value.String(); v != "" && !slices.Contains(p.known, v) {
			return refuse("--%s %q: the dashboard plans presets only (%s); gpucoord plan reads files", p.flag, v, strings.Join(p.known, ", "))
		}
	}
	svg, err := os.CreateTemp("", "gpucoord-plan-*.svg")
	if err != nil {
		return nil, err
	}
	svg.Close()
	defer os.Remove(svg.Name())
	var out, errw bytes.Buffer
	cmd := newPlanCmd()
	cmd.SetArgs(append(slices.Clone(args), "--json", "--svg", svg.Name()))
	cmd.SetOut(&out)
	cmd.SetErr(&errw)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err = cmd.ExecuteContext(ctx)
	ans := &coordinator.PlanAnswer{Command: planLine(args), Fits: err == nil}
	var ee *exitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.code == exitNoFit:
	default:
		ans.Error = err.Error()
		return ans, nil
	}
	if !json.Valid(out.Bytes()) {
		return nil, fmt.Errorf("plan --json printed no JSON: %.200s", out.String())
	}
	ans.Plan = bytes.TrimSpace(out.Bytes())
	b, err := os.ReadFile(svg.Name())
	if err != nil {
		return nil, err
	}
	ans.SVG = string(b)
	return ans, nil
}

// planLine is the plan command line of args, for a shell.
func planLine(args []string) string {
	q := []string{"gpucoord", "plan"}
	for _, a := range args {
		q = append(q, shellQuote(a))
	}
	return strings.Join(q, " ")
}
