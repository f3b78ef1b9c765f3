package coordinator

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// FuzzCacheValues puts arbitrary values under every key the cache reads
// from etcd (protojson for the protocol's messages, JSON for the leader's
// policy) and then asks for everything built from them: each job's
// decision and each node's assignment. Nothing but gpucoord writes under
// the prefix, yet a value it cannot read (from another version, or written
// by hand with etcdctl) must be ignored or decided on, never panic.
func FuzzCacheValues(f *testing.F) {
	f.Add(`{"id":"j","nodes":2,"gpusPerNode":1,"command":["true"]}`, `{"phase":"RUNNING"}`,
		`{"job":"j","number":1,"members":[{"node":"n1","firstRank":0,"ranks":1},{"node":"n2","firstRank":1,"ranks":1}],"world":2,"dp":2}`,
		`{"master":"10.0.0.1:1"}`, `{"rank":1,"code":1}`, `{"name":"n1","host":"10.0.0.1","gpus":1}`, `{"strikes":3}`, `{"step":"4","checkpointed":true}`)
	f.Add(`{"id":"j","nodes":-1}`, `{"phase":"PENDING"}`, `{"number":"9223372036854775807","members":[{"node":"n1","firstRank":-5,"ranks":2147483647}]}`,
		`{}`, `{"rank":-1}`, `{"gpus":0}`, `[]`, `{"step":"-1"}`)
	f.Add("", "", "", "", "", "", "", "")
	p := DefaultConfig().policy()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, spec, state, gen, boot, exit, node, policy, commit string) {
		k := keys("/f/")
		c := newCache(nil, k, log)
		var kvs []*mvccpb.KeyValue
		put := func(key, value string) {
			kvs = append(kvs, &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), CreateRevision: int64(len(kvs) + 1), ModRevision: int64(len(kvs) + 1)})
		}
		put(k.spec("j"), spec)
		put(k.state("j"), state)
		put(k.generation("j"), gen)
		put(k.bootstrap("j", 1), boot)
		put(k.exit("j", 1, 1), exit)
		put(k.commit("j"), commit)
		put(k.progress("j"), commit)
		put(k.policy("j"), policy)
		put(k.node("n1"), node)
		put(k.node("n2"), node)
		put(k.conn("n1"), "c/1")
		put(k.nodePolicy("n1"), policy)
		c.reset(int64(len(kvs)), kvs)
		now := time.UnixMilli(1_700_000_000_000)
		for _, id := range c.ids() {
			if v, ok := c.view(id); ok {
				decide(v, now, p)
			}
		}
		for _, n := range []string{"n1", "n2", "n3"} {
			c.assignment(n)
		}
		c.generation("j")
		c.jobsNow()
	})
}
