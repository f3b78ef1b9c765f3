package coordinator

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// metrics are the coordinator's Prometheus metrics. The pool and job
// figures are read from etcd at each scrape (a collector, not counters
// kept in memory), so every coordinator, leader or standby, reports the
// same truth; only the keep-alive latency is this coordinator's own.
type metrics struct {
	s         *server
	leader    func() bool
	keepalive prometheus.Histogram
	nodes     *prometheus.Desc
	busy      *prometheus.Desc
	isLeader  *prometheus.Desc
	jobs      *prometheus.Desc
	gen       *prometheus.Desc
	step      *prometheus.Desc
	stepSecs  *prometheus.Desc
	restarts  *prometheus.Desc
	hangs     *prometheus.Desc
	members   *prometheus.Desc
	straggler *prometheus.Desc
	etcdReqs  *prometheus.Desc
	relayed   *prometheus.Desc
	fallbacks *prometheus.Desc
	requests  *requestCounter
}

func newMetrics(s *server, leader func() bool, requests *requestCounter) *metrics {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("gpucoord_"+name, help, labels, nil)
	}
	return &metrics{
		s: s, leader: leader, requests: requests,
		keepalive: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpucoord_lease_renewal_interval_seconds",
			Help:    "Time between two renewals of an agent's lease, as this coordinator received them while the agent's Watch stream was open: a third of the lease TTL when etcd answers at once, longer when it is slow.",
			Buckets: prometheus.ExponentialBuckets(0.05, 1.5, 14),
		}),
		etcdReqs:  d("etcd_requests_total", "Requests this coordinator sent etcd, by method: a unary call, or a message on a stream (a watch created, a lease renewed).", "method"),
		relayed:   d("relayed_assignments_total", "Assignments this coordinator's streams sent through the members' block relays (one message a block for a job's change)."),
		fallbacks: d("relay_fallbacks_total", "Assignments this coordinator's streams sent a node themselves because its relay reported no delivery within two seconds."),
		nodes:     d("nodes", "Nodes registered and alive in the pool."),
		busy:      d("nodes_busy", "Nodes running a job's generation."),
		isLeader:  d("leader", "1 when this coordinator is the elected leader."),
		jobs:      d("jobs", "Jobs by phase (pending, running, succeeded, failed, cancelled), ended ones among the last kept.", "phase"),
		gen:       d("job_generation", "The job's current generation.", "job_id"),
		step:      d("job_step", "The last step rank 0 reported.", "job_id"),
		stepSecs:  d("job_step_seconds", "Wall time of the last reported step.", "job_id"),
		restarts:  d("job_restarts_total", "Generations after the first (restarts) of a job not ended.", "job_id"),
		hangs:     d("job_hangs_total", "Generations of a job not ended that ended because a rank hung (made no progress for the hang timeout).", "job_id"),
		members:   d("job_members", "Nodes in the job's current generation.", "job_id"),
		straggler: d("job_straggler_ratio", "A straggling rank's compute time over the median of its generation.", "job_id", "node", "rank", "gpu"),
	}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.nodes, m.busy, m.isLeader, m.jobs, m.gen, m.step, m.stepSecs, m.restarts, m.hangs, m.members, m.straggler, m.etcdReqs, m.relayed, m.fallbacks} {
		ch <- d
	}
	m.keepalive.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.keepalive.Collect(ch)
	m.requests.each(func(method string, n int64) {
		ch <- prometheus.MustNewConstMetric(m.etcdReqs, prometheus.CounterValue, float64(n), method)
	})
	lead := 0.0
	if m.leader() {
		lead = 1
	}
	ch <- prometheus.MustNewConstMetric(m.isLeader, prometheus.GaugeValue, lead)
	ch <- prometheus.MustNewConstMetric(m.relayed, prometheus.CounterValue, float64(m.s.relayedSent.Load()))
	ch <- prometheus.MustNewConstMetric(m.fallbacks, prometheus.CounterValue, float64(m.s.relayFallbacks.Load()))
	nodes, _, _, rev := m.s.cache.pool()
	if rev == 0 {
		return // not listed yet: the scrape shows the gap
	}
	jobs := m.s.cache.jobsNow()
	busy := 0
	for _, j := range jobs {
		if !j.terminal() && j.gen != nil {
			busy += len(j.gen.Members)
		}
	}
	ch <- prometheus.MustNewConstMetric(m.nodes, prometheus.GaugeValue, float64(len(nodes)))
	ch <- prometheus.MustNewConstMetric(m.busy, prometheus.GaugeValue, float64(busy))
	phases := map[pb.JobState_Phase]int{}
	for _, j := range jobs {
		phases[j.state.GetPhase()]++
		if j.terminal() {
			continue // a job's own series end with it
		}
		id := j.spec.Id
		if j.gen != nil {
			ch <- prometheus.MustNewConstMetric(m.gen, prometheus.GaugeValue, float64(j.gen.Number), id)
			ch <- prometheus.MustNewConstMetric(m.restarts, prometheus.CounterValue, float64(j.gen.Number-1), id)
			ch <- prometheus.MustNewConstMetric(m.hangs, prometheus.CounterValue, float64(j.gen.Hangs), id)
			ch <- prometheus.MustNewConstMetric(m.members, prometheus.GaugeValue, float64(len(j.gen.Members)), id)
		}
		for _, s := range j.stragglers.GetRanks() {
			ch <- prometheus.MustNewConstMetric(m.straggler, prometheus.GaugeValue, s.Ratio, id, s.Node, strconv.Itoa(int(s.Rank)), strconv.Itoa(int(s.LocalRank)))
		}
		if j.step != nil {
			ch <- prometheus.MustNewConstMetric(m.step, prometheus.GaugeValue, float64(j.step.Step), id)
			ch <- prometheus.MustNewConstMetric(m.stepSecs, prometheus.GaugeValue, j.step.Seconds, id)
		}
	}
	for p, name := range pb.JobState_Phase_name {
		if p != 0 {
			ch <- prometheus.MustNewConstMetric(m.jobs, prometheus.GaugeValue, float64(phases[pb.JobState_Phase(p)]), strings.ToLower(name))
		}
	}
}

// serveMetrics serves /metrics on ln until ctx ends.
func serveMetrics(ctx context.Context, ln net.Listener, reg *prometheus.Registry) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if os.Getenv("GPUCOORD_PPROF") != "" {
		// Go's profiles beside the metrics, only when asked for: how the
		// load benchmarks see a running coordinator's heap and CPU.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		// The embedded etcd's own series (its read indexes, applies,
		// leases), which register with Prometheus's default registry.
		mux.Handle("/debug/metrics", promhttp.Handler())
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
