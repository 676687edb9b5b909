// Command devserver runs the whole Better Compute control plane on an embedded PostgreSQL, for
// development:
//
//	go run ./examples/devserver [-sim N] [-addr 127.0.0.1:8080] [-gateway 127.0.0.1:8443] [-data-dir .devdata]
//
// It prints the API's URL and a development API key with every right in the root tenant, and
// stops cleanly on Ctrl-C. With -data-dir, a restart keeps what was created.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/internal/devserver"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/vps"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to serve the API (and JoinService) on")
	gateway := flag.String("gateway", "127.0.0.1:8443", "address to serve node sessions on (gRPC over mutual TLS)")
	dataDir := flag.String("data-dir", "", "keep the database and secret in this directory across restarts (default: a temporary database, deleted on exit)")
	verbose := flag.Bool("v", false, "log debug messages")
	simN := flag.Int("sim", 0, "join this many simulated GPU machines (8 H100s each) into the pool \"gpu\"")
	flag.Parse()

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	s, err := devserver.Start(ctx, devserver.Options{Addr: *addr, GatewayAddr: *gateway, DataDir: *dataDir, Logger: logger, Sim: *simN,
		Modules: metalModule})
	if err != nil {
		fmt.Fprintln(os.Stderr, "devserver:", err)
		os.Exit(1)
	}
	fmt.Printf("Better Compute devserver\n  URL:     %s\n  Console: %s\n  Gateway: %s\n  API key: %s\n", s.URL, s.Console, s.Gateway, s.APIKey)
	if hash, err := s.Compute.Runtime().Fleet.CAHash(); err == nil {
		fmt.Printf("  CA hash: %s (bcd join --ca-hash pins the machine CA)\n", hash)
	}
	if *simN > 0 {
		fmt.Printf("  Nodes:   %d simulated machines with 8 H100s each, in pool %q\n", *simN, devserver.SimPool)
	}
	fmt.Println()
	fmt.Printf("Try:\n  curl -X POST -H \"Authorization: Bearer %s\" %s/api/compute/pools/list -d '{}'\n\nCtrl-C stops it.\n", s.APIKey, s.URL)

	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "devserver: stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Stop(sctx); err != nil {
		fmt.Fprintln(os.Stderr, "devserver:", err)
		os.Exit(1)
	}
}

// metalModule is the bare-metal module (machines, sites, deploys, leases: docs/metal.md), its
// deployed systems joining at the devserver's URL, and the VM module (flavors, images,
// instances on bcd hosts: docs/vps.md).
func metalModule(url string) ([]compute.Module, error) {
	m, err := metal.New(metal.Options{JoinURL: url})
	if err != nil {
		return nil, err
	}
	v, err := vps.New(vps.Options{})
	return []compute.Module{m, v}, err
}
