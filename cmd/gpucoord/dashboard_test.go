package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/e2e"
)

// TestDashboardScraped: a real Prometheus (Debian's prometheus, started
// here) scrapes a coordinator that runs a job, and every query of the
// Grafana dashboard in examples/grafana returns series from what it
// scraped (the stragglers' panel only parses: no rank straggles here).
func TestDashboardScraped(t *testing.T) {
	const prom = "/usr/bin/prometheus"
	if _, err := os.Stat(prom); err != nil {
		t.Fatalf("%s: %v (make deps installs Debian's prometheus)", prom, err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	b, err := os.ReadFile("../../examples/grafana/gpucoord.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	exe := e2e.Binary(t)
	metrics := freeAddr(t)
	_, addr := coordinatorProc(t, exe, "--metrics", metrics)
	workerProc(t, exe, addr, "w0", 2)
	d := start(t, exe, "launch", "--coordinator", addr, "--nodes", "1", "--gpus-per-node", "2", "--job-id", "dash", "--detach",
		"--steps", "100000", "../../examples/jobs/mlp.yaml")
	if code := d.wait(t, time.Minute); code != 0 {
		t.Fatalf("launch --detach exited %d:\n%s", code, d.output())
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "prometheus.yml")
	os.WriteFile(conf, fmt.Appendf(nil, "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gpucoord\n    static_configs:\n      - targets: [%q]\n", metrics), 0o644)
	web := freeAddr(t)
	start(t, prom, "--config.file", conf, "--storage.tsdb.path", filepath.Join(dir, "data"), "--web.listen-address", web)
	query := func(q string) (status string, n int) {
		resp, err := http.Get("http://" + web + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return err.Error(), 0
		}
		defer resp.Body.Close()
		var r struct {
			Status string
			Error  string
			Data   struct{ Result []json.RawMessage }
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return err.Error(), 0
		}
		return r.Status + r.Error, len(r.Data.Result)
	}
	// Rates need two samples in their window: wait until the job's step
	// has been scraped a few times.
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if _, n := query(`count_over_time(gpucoord_job_step{job_id="dash"}[5m]) >= 3`); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Prometheus did not scrape the job's step three times in 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	queries := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			q := strings.NewReplacer(`$job_id`, ".*", `$job`, "gpucoord").Replace(tg.Expr)
			status, n := query(q)
			queries++
			switch {
			case status != "success":
				t.Errorf("panel %q: %s: %s", p.Title, q, status)
			case n == 0 && !strings.Contains(q, "straggler"):
				t.Errorf("panel %q: %s: no series", p.Title, q)
			}
		}
	}
	if len(dash.Panels) < 10 || queries < 15 {
		t.Errorf("the dashboard has %d panels and %d queries", len(dash.Panels), queries)
	}
}
