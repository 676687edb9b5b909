package metrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// ScrapeTimeout bounds the queries one scrape runs.
const ScrapeTimeout = 2 * time.Second

// PoolGPUs is the whole GPUs on the schedulable nodes of one pool and model, as the capacity
// rollups count them (and capacity.summary answers): Free + Used + Spot = Total.
type PoolGPUs struct {
	Tenant, Pool, Model     string
	Total, Free, Used, Spot int
}

// Reservations is how many reservations of one pool are in one state.
type Reservations struct {
	Tenant, Pool, State string
	Count               int
}

// Fleet is what the fleet collector reads at every scrape, each with one query.
type Fleet struct {
	GPUs         func(context.Context) ([]PoolGPUs, error)
	Reservations func(context.Context) ([]Reservations, error)
}

var (
	gpuLabels   = []string{"tenant", "pool", "model"}
	gpusTotal   = prometheus.NewDesc(Namespace+"_gpus", "Whole GPUs on schedulable nodes, by pool and model.", gpuLabels, nil)
	gpusFree    = prometheus.NewDesc(Namespace+"_gpus_free", "Whole GPUs on schedulable nodes with no booking now, by pool and model.", gpuLabels, nil)
	gpusUsed    = prometheus.NewDesc(Namespace+"_gpus_used", "Whole GPUs on schedulable nodes booked now, spot bookings excluded, by pool and model.", gpuLabels, nil)
	gpusSpot    = prometheus.NewDesc(Namespace+"_gpus_spot", "Whole GPUs on schedulable nodes held by spot bookings only, by pool and model.", gpuLabels, nil)
	resvDesc    = prometheus.NewDesc(Namespace+"_reservations", "Live reservations (pending or active), by pool and state.", []string{"tenant", "pool", "state"}, nil)
	scrapeError = prometheus.NewDesc(Namespace+"_scrape_errors", "1 when a query of this scrape failed (the log has why), by query.", []string{"query"}, nil)
)

type fleetCollector struct {
	f   Fleet
	log *slog.Logger
}

// Fleet registers a collector that reads f at every scrape, each query bounded by ScrapeTimeout.
func (m *Metrics) Fleet(f Fleet, log *slog.Logger) {
	if m == nil {
		return
	}
	m.reg.MustRegister(fleetCollector{f, log})
}

func (c fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{gpusTotal, gpusFree, gpusUsed, gpusSpot, resvDesc, scrapeError} {
		ch <- d
	}
}

func (c fleetCollector) Collect(ch chan<- prometheus.Metric) {
	failed := func(query string, err error) {
		c.log.Warn("compute: metrics: query failed", "query", query, "error", err)
		ch <- prometheus.MustNewConstMetric(scrapeError, prometheus.GaugeValue, 1, query)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ScrapeTimeout)
	defer cancel()
	if gpus, err := c.f.GPUs(ctx); err != nil {
		failed("gpus", err)
	} else {
		for _, g := range gpus {
			l := []string{g.Tenant, g.Pool, g.Model}
			ch <- prometheus.MustNewConstMetric(gpusTotal, prometheus.GaugeValue, float64(g.Total), l...)
			ch <- prometheus.MustNewConstMetric(gpusFree, prometheus.GaugeValue, float64(g.Free), l...)
			ch <- prometheus.MustNewConstMetric(gpusUsed, prometheus.GaugeValue, float64(g.Used), l...)
			ch <- prometheus.MustNewConstMetric(gpusSpot, prometheus.GaugeValue, float64(g.Spot), l...)
		}
	}
	if rs, err := c.f.Reservations(ctx); err != nil {
		failed("reservations", err)
	} else {
		for _, r := range rs {
			ch <- prometheus.MustNewConstMetric(resvDesc, prometheus.GaugeValue, float64(r.Count), r.Tenant, r.Pool, r.State)
		}
	}
}

var (
	dbAcquired    = prometheus.NewDesc(Namespace+"_db_conns_acquired", "Database connections in use now.", nil, nil)
	dbIdle        = prometheus.NewDesc(Namespace+"_db_conns_idle", "Idle database connections in the pool.", nil, nil)
	dbTotal       = prometheus.NewDesc(Namespace+"_db_conns", "Database connections in the pool (acquired, idle and being opened).", nil, nil)
	dbMax         = prometheus.NewDesc(Namespace+"_db_conns_max", "The pool's connection limit.", nil, nil)
	dbAcquires    = prometheus.NewDesc(Namespace+"_db_acquires_total", "Connections acquired from the pool.", nil, nil)
	dbWaits       = prometheus.NewDesc(Namespace+"_db_acquire_waits_total", "Acquisitions that had to wait for a connection (none was idle).", nil, nil)
	dbWaitSeconds = prometheus.NewDesc(Namespace+"_db_acquire_wait_seconds_total", "Time spent waiting by acquisitions that found no idle connection.", nil, nil)
	dbCanceled    = prometheus.NewDesc(Namespace+"_db_acquires_canceled_total", "Acquisitions cancelled (their context ended) before they got a connection.", nil, nil)
)

type poolCollector struct{ p *pgxpool.Pool }

// DBPool registers a collector of the pool's statistics (pgxpool's Stat), read at every scrape.
func (m *Metrics) DBPool(p *pgxpool.Pool) {
	if m == nil {
		return
	}
	m.reg.MustRegister(poolCollector{p})
}

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dbAcquired, dbIdle, dbTotal, dbMax, dbAcquires, dbWaits, dbWaitSeconds, dbCanceled} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.Stat()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(dbAcquired, float64(s.AcquiredConns()))
	gauge(dbIdle, float64(s.IdleConns()))
	gauge(dbTotal, float64(s.TotalConns()))
	gauge(dbMax, float64(s.MaxConns()))
	counter(dbAcquires, float64(s.AcquireCount()))
	counter(dbWaits, float64(s.EmptyAcquireCount()))
	counter(dbWaitSeconds, s.EmptyAcquireWaitTime().Seconds())
	counter(dbCanceled, float64(s.CanceledAcquireCount()))
}
