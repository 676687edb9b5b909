// Package metrics holds the control plane's Prometheus series: one Metrics per Compute, on that
// Compute's own registry, handed to the envelope, the gateway and the workers through their
// Config. A nil *Metrics records nothing, so every constructor keeps working without one.
// Labels are bounded: methods, codes, worker names and command kinds come from the registry,
// pools from what an operator created; never a node's or a reservation's id.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Namespace prefixes every series.
const Namespace = "better_compute"

// Metrics are the series that code paths record into. Gauges read at scrape time (the fleet's
// capacity, the database pool, the gateway's sessions) are collectors registered beside them.
type Metrics struct {
	reg prometheus.Registerer

	apiCalls       *prometheus.CounterVec
	apiSeconds     *prometheus.HistogramVec
	batchSize      *prometheus.HistogramVec
	iamSeconds     *prometheus.HistogramVec
	refused        *prometheus.CounterVec
	flushSeconds   prometheus.Histogram
	flushNodes     prometheus.Histogram
	flushFailures  prometheus.Counter
	lastFlush      prometheus.Gauge
	commandSeconds *prometheus.HistogramVec
	tickSeconds    *prometheus.HistogramVec
	tickFailures   *prometheus.CounterVec
	lastTick       *prometheus.GaugeVec
	webhooks       *prometheus.CounterVec
	webhookSeconds prometheus.Histogram
}

// New registers the series on reg and returns them.
func New(reg prometheus.Registerer) *Metrics {
	name := func(n string) string { return Namespace + "_" + n }
	m := &Metrics{
		reg: reg,
		apiCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("api_calls_total"),
			Help: "API calls by method and result code (ok or an api error code)."}, []string{"method", "code"}),
		apiSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name("api_call_seconds"),
			Help:    "Duration of API calls through the envelope (authentication to answer), by method and result code.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"method", "code"}),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name("batch_size"),
			Help:    "Calls carried by one group-commit transaction, by method.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64}}, []string{"method"}),
		iamSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name("iam_decision_seconds"),
			Help:    "Duration of IAM authorization decisions asked of the IAM port (cache hits excluded), by outcome.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}}, []string{"outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("gateway_admissions_refused_total"),
			Help: "Node connections refused beyond the gateway's admission rate, by stage (handshake or session)."}, []string{"stage"}),
		flushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: name("gateway_flush_seconds"),
			Help:    "Duration of the gateway's heartbeat flushes (one transaction for every heartbeat since the last).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}),
		flushNodes: prometheus.NewHistogram(prometheus.HistogramOpts{Name: name("gateway_flush_nodes"),
			Help:    "Nodes written by one heartbeat flush.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8)}),
		flushFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: name("gateway_flush_failures_total"),
			Help: "Heartbeat flushes that failed (their heartbeats are lost; the next ones are written by a later flush)."}),
		lastFlush: prometheus.NewGauge(prometheus.GaugeOpts{Name: name("gateway_last_flush_timestamp_seconds"),
			Help: "When the gateway last wrote its heartbeats (Unix time): time() minus it is the heartbeat lag."}),
		commandSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name("command_round_trip_seconds"),
			Help:    "From a command's creation to its result recorded by the gateway, by kind and result (succeeded or failed).",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}, []string{"kind", "result"}),
		tickSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name("worker_tick_seconds"),
			Help:    "Duration of one round of a periodic worker, by worker.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"worker"}),
		tickFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("worker_tick_failures_total"),
			Help: "Rounds of a periodic worker that failed, by worker."}, []string{"worker"}),
		lastTick: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name("worker_last_success_timestamp_seconds"),
			Help: "When a periodic worker last finished a round without error (Unix time), by worker."}, []string{"worker"}),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("webhook_attempts_total"),
			Help: "Webhook delivery attempts by outcome: delivered (a 2xx answer), failed (retried later) or dead (given up)."}, []string{"outcome"}),
		webhookSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: name("webhook_attempt_seconds"),
			Help:    "Duration of webhook delivery attempts, request to answer.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}),
	}
	reg.MustRegister(m.apiCalls, m.apiSeconds, m.batchSize, m.iamSeconds, m.refused, m.flushSeconds, m.flushNodes,
		m.flushFailures, m.lastFlush, m.commandSeconds, m.tickSeconds, m.tickFailures, m.lastTick, m.webhooks, m.webhookSeconds)
	for _, stage := range []string{"handshake", "session"} {
		m.refused.WithLabelValues(stage) // at zero from the start, so that rate() sees the first
	}
	for _, outcome := range []string{"delivered", "failed", "dead"} {
		m.webhooks.WithLabelValues(outcome)
	}
	return m
}

// APICall records one API call of method that answered code ("ok" when it succeeded).
func (m *Metrics) APICall(method, code string, took time.Duration) {
	if m == nil {
		return
	}
	m.apiCalls.WithLabelValues(method, code).Inc()
	m.apiSeconds.WithLabelValues(method, code).Observe(took.Seconds())
}

// Batch records a group-commit transaction of method that carried n calls.
func (m *Metrics) Batch(method string, n int) {
	if m == nil {
		return
	}
	m.batchSize.WithLabelValues(method).Observe(float64(n))
}

// IAMDecision records one decision asked of the IAM port: outcome is allowed, denied,
// confirmation_required or error.
func (m *Metrics) IAMDecision(outcome string, took time.Duration) {
	if m == nil {
		return
	}
	m.iamSeconds.WithLabelValues(outcome).Observe(took.Seconds())
}

// Refused records a node connection refused by admission at stage handshake or session.
func (m *Metrics) Refused(stage string) {
	if m == nil {
		return
	}
	m.refused.WithLabelValues(stage).Inc()
}

// Flush records one heartbeat flush of n nodes; err is its failure.
func (m *Metrics) Flush(n int, took time.Duration, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.flushFailures.Inc()
		return
	}
	m.flushSeconds.Observe(took.Seconds())
	m.flushNodes.Observe(float64(n))
	m.lastFlush.SetToCurrentTime()
}

// WebhookAttempt records a webhook delivery attempt: outcome is delivered, failed or dead;
// took is zero for a delivery given up without an attempt.
func (m *Metrics) WebhookAttempt(outcome string, took time.Duration) {
	if m == nil {
		return
	}
	m.webhooks.WithLabelValues(outcome).Inc()
	if took > 0 {
		m.webhookSeconds.Observe(took.Seconds())
	}
}

// Command records a command's round trip, created to result recorded.
func (m *Metrics) Command(kind string, ok bool, took time.Duration) {
	if m == nil {
		return
	}
	result := "succeeded"
	if !ok {
		result = "failed"
	}
	m.commandSeconds.WithLabelValues(kind, result).Observe(took.Seconds())
}

// Tick records one round of the periodic worker named worker; err is its failure.
func (m *Metrics) Tick(worker string, took time.Duration, err error) {
	if m == nil {
		return
	}
	m.tickSeconds.WithLabelValues(worker).Observe(took.Seconds())
	if err != nil {
		m.tickFailures.WithLabelValues(worker).Inc()
		return
	}
	m.lastTick.WithLabelValues(worker).SetToCurrentTime()
}

// Gateway registers gauges of a gateway read at scrape time: the sessions it holds and the
// heartbeat interval it asks of its nodes.
func (m *Metrics) Gateway(sessions func() int, interval func() time.Duration) {
	if m == nil {
		return
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: Namespace + "_gateway_sessions",
			Help: "Node sessions this process's gateway holds."}, func() float64 { return float64(sessions()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: Namespace + "_gateway_heartbeat_interval_seconds",
			Help: "The heartbeat interval this process's gateway asks of its nodes now."}, func() float64 { return interval().Seconds() }),
	)
}
