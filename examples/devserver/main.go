// Command devserver runs the whole Better Compute control plane on an embedded PostgreSQL, for
// development:
//
//	go run ./examples/devserver [--sim N] [--listen 127.0.0.1:8080] [--gateway-listen 127.0.0.1:8443] [--data-dir .devdata]
//
// It prints the API's URL, a development API key with every right in the root tenant and the
// database's URL, and stops cleanly on Ctrl-C. With --data-dir, a restart keeps what was created,
// and the key. Its flags are `better-compute dev`'s (devserver.Options.Flags).
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
	"github.com/better-compute/compute/devserver"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/vps"
)

func main() {
	o := devserver.Options{Modules: metalModule}
	var verbose bool
	o.Flags(flag.CommandLine, &verbose)
	flag.BoolVar(&verbose, "v", false, "deprecated: --verbose")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { // the names this command had before
		if now, ok := devserver.Deprecated[f.Name]; ok {
			fmt.Fprintf(os.Stderr, "devserver: -%s is deprecated: use --%s\n", f.Name, now)
		} else if f.Name == "v" {
			fmt.Fprintln(os.Stderr, "devserver: -v is deprecated: use --verbose")
		}
	})

	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	s, err := devserver.Start(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err) // it says "devserver: " already
		os.Exit(1)
	}
	s.Describe(os.Stdout)
	if o.Sim > 0 {
		fmt.Printf("  Nodes:    %d simulated machines with %d H100s each, in pool %q\n", o.Sim, devserver.SimGPUs, devserver.SimPool)
	}
	fmt.Println()
	fmt.Printf("Try:\n  curl -X POST -H \"Authorization: Bearer %s\" %s/api/compute/pools/list -d '{}'\n\nCtrl-C stops it.\n", s.APIKey, s.URL)

	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "devserver: stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Stop(sctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
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
