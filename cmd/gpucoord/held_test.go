package main

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/testcluster"
)

// Checkpoints the agents hold, on hosts with their own /tmp and /dev/shm
// and no shared directory.

// heldJob launches, from h1, the native job with tp 2 on nodes hosts of 2
// ranks, with no --checkpoint-dir: the agents hold every step's
// checkpoint in /dev/shm and replicate it to one peer.
func (b *boxCluster) heldJob(t *testing.T, nodes, steps int, args ...string) *proc {
	t.Helper()
	return b.run(t, b.Host(1), append([]string{"launch", "--coordinator", b.local, "--nodes", strconv.Itoa(nodes), "--gpus-per-node", "2",
		"--tp", "2", "--max-restarts", "2", "--steps", strconv.Itoa(steps), "--json"}, append(args, b.job)...)...)
}

var genNodes = regexp.MustCompile(`generation 1: \d+ nodes? \(([^)]*)\)`)

// TestClusterHeldCheckpoints: the native job on 2 hosts and a spare; the
// host of rank 0 (then, in another run, of the last rank) is killed at a
// random step. The spare takes its place, gathering the last commit from
// the replicas; the job ends on train's curve with at most one step
// redone.
func TestClusterHeldCheckpoints(t *testing.T) {
	for _, victim := range []string{"rank 0", "last rank"} {
		t.Run(victim, func(t *testing.T) {
			const steps = 80
			b := newBoxCluster(t, testcluster.Config{Hosts: 4})
			want := reference(t, b.exe, "--steps", strconv.Itoa(steps), "testdata/mlp48.yaml")
			b.coordinator(t, b.Host(1), b.local)
			b.worker(t, b.Host(2), 2)
			b.worker(t, b.Host(3), 2)
			p := b.heldJob(t, 2, steps)
			m := genNodes.FindStringSubmatch(p.waitLine(t, "generation 1:", time.Minute))
			if m == nil {
				t.Fatalf("no nodes in the generation line:\n%s", p.output())
			}
			order := strings.Split(m[1], ", ")
			name := order[0]
			if victim == "last rank" {
				name = order[len(order)-1]
			}
			spare := b.worker(t, b.Host(4), 2)
			at := 10 + rand.IntN(30)
			p.waitLine(t, fmt.Sprintf(`{"step":%d,`, at), time.Minute)
			killed := time.Now()
			b.hostNamed(t, name).Kill()
			p.waitLine(t, `"generation":2,`, time.Minute)
			t.Logf("%s's host %s killed at step %d: first step of generation 2 reported %s after the kill",
				victim, name, at, time.Since(killed).Round(time.Millisecond))
			if code := p.wait(t, 3*time.Minute); code != 0 {
				t.Fatalf("launch exited %d:\n%s", code, p.output())
			}
			sameLosses(t, losses(t, p.output()), want)
			atMostOneRedone(t, p.output())
			if !strings.Contains(spare.output(), "restored from peers") {
				t.Errorf("the spare did not gather the commit from its peers:\n%s", spare.output())
			}
		})
	}
}

// hostNamed is the box's host of that name.
func (b *boxCluster) hostNamed(t *testing.T, name string) *testcluster.Host {
	t.Helper()
	for _, h := range b.Hosts() {
		if h.Name == name {
			return h
		}
	}
	t.Fatalf("no host %q", name)
	return nil
}

// TestClusterReplicasLost: both hosts that hold one node's files of the
// last commit (the node's own, h2, and its replica's, h3) are killed at
// once. With a backup tier the job goes on from its last step there, on
// train's curve; without one it fails with one line naming the lost step.
func TestClusterReplicasLost(t *testing.T) {
	for _, backup := range []bool{true, false} {
		t.Run(map[bool]string{true: "with backup", false: "without"}[backup], func(t *testing.T) {
			const steps = 60
			b := newBoxCluster(t, testcluster.Config{Hosts: 4, Shared: backup})
			want := reference(t, b.exe, "--steps", strconv.Itoa(steps), "testdata/mlp48.yaml")
			b.pool(t)
			var args []string
			if backup {
				args = []string{"--checkpoint-backup", filepath.Join(b.Shared(), "backup"), "--backup-every", "5"}
			}
			p := b.heldJob(t, 3, steps, append(args, "--min-nodes", "1")...)
			p.waitLine(t, "generation 1: 3 nodes (h2, h3, h4)", time.Minute)
			if backup {
				p.waitLine(t, `"backup":true`, time.Minute)
			} else {
				p.waitLine(t, `{"committed":`, time.Minute)
			}
			p.waitLine(t, `{"step":20,`, time.Minute)
			b.Host(2).Kill()
			b.Host(3).Kill()
			code := p.wait(t, 3*time.Minute)
			out := p.output()
			if !backup {
				line := regexp.MustCompile(`the checkpoint of step \d+ is lost: no live node holds node h2's files of it \(held by h2, h3\)[^\n]*`).FindString(out)
				if code == 0 || line == "" {
					t.Fatalf("launch exited %d without naming the lost step:\n%s", code, out)
				}
				t.Logf("launch exited %d: %s", code, line)
				return
			}
			if code != 0 {
				t.Fatalf("launch exited %d:\n%s", code, out)
			}
			gen := regexp.MustCompile(`generation 2: [^\n]*the replicas of step (\d+) are gone, so from the backup tier's step (\d+)[^\n]*`).FindStringSubmatch(out)
			if gen == nil {
				t.Fatalf("generation 2 does not say it resumed from the backup tier:\n%s", out)
			}
			t.Logf("%s", gen[0])
			if n, _ := strconv.Atoi(gen[2]); n%5 != 0 || n < 5 {
				t.Errorf("resumed from the backup tier's step %d, want a multiple of --backup-every 5", n)
			}
			sameLosses(t, losses(t, out), want)
		})
	}
}
