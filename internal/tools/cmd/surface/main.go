// Command surface records the API's and the node protocol's surfaces (api/surface.json,
// agent/v1/surface.txt) from the code, and refuses a breaking change that does not come with a
// new api.Version or agentv1.ProtocolVersion. With -check it writes nothing and fails when a
// snapshot is stale, as CI does (docs/compatibility.md).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/better-compute/compute/internal/tools/surface"
)

func main() {
	check := flag.Bool("check", false, "fail if a snapshot is out of date instead of writing it")
	root := flag.String("root", ".", "the module's root")
	flag.Parse()
	apiV, live, err := surface.CheckAPI(*root)
	if err != nil {
		fail(err)
	}
	protoV, liveProto, err := surface.CheckProtocol(*root)
	if err != nil {
		fail(err)
	}
	bad := false
	for _, v := range []surface.Verdict{apiV, protoV} {
		if v.Stale() && (*check || v.Refused()) {
			fmt.Fprint(os.Stderr, v.Message())
			bad = true
		}
	}
	if bad {
		os.Exit(1)
	}
	if apiV.Stale() {
		b, err := surface.EncodeAPI(live)
		if err != nil {
			fail(err)
		}
		write(filepath.Join(*root, surface.APIPath), b, apiV)
	}
	if protoV.Stale() {
		write(filepath.Join(*root, surface.ProtocolPath), []byte(liveProto), protoV)
	}
}

func write(path string, b []byte, v surface.Verdict) {
	if err := os.WriteFile(path, b, 0o644); err != nil {
		fail(err)
	}
	fmt.Printf("surface: wrote %s (version %d): %d breaking, %d added\n", path, v.Version, len(v.Changes.Breaking), len(v.Changes.Added))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "surface:", err)
	os.Exit(1)
}
