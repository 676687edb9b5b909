package nodeagent

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// FuzzDecodeArgs: whatever arguments a command carries, decoding never panics, and what it
// accepts is in range: a GPU index from 0 to MaxGPUIndex, a known diag test, bounded seconds.
func FuzzDecodeArgs(f *testing.F) {
	for _, seed := range []struct{ kind, args string }{
		{"gpu.reset", `{"gpu": 3}`},
		{"gpu.reset", `{"gpu": -1}`},
		{"gpu.reset", `{"gpu": 1e300, "force": true}`},
		{"gpu.reset", `{"gpu": 2.5}`},
		{"gpu.reset", `{"gpu": "all"}`},
		{"gpu.reset", `{"gpu": 0, "force": "yes"}`},
		{"gpu.reset", `{}`},
		{"diag.run", `{"test": "long", "seconds": 60}`},
		{"diag.run", `{"test": "; rm -rf /"}`},
		{"diag.run", `{"seconds": -5}`},
		{"diag.run", `{"test": null}`},
		{"health.check", `{"anything": [1, 2]}`},
	} {
		f.Add(seed.kind, seed.args)
	}
	f.Fuzz(func(t *testing.T, kind, raw string) {
		var args structpb.Struct
		if err := protojson.Unmarshal([]byte(raw), &args); err != nil {
			return
		}
		a, err := DecodeArgs(kind, &args)
		if err != nil {
			return
		}
		switch kind {
		case "gpu.reset":
			if a.GPU < 0 || a.GPU > MaxGPUIndex {
				t.Fatalf("%s accepted gpu %d", raw, a.GPU)
			}
		case "diag.run":
			if a.Test != "quick" && a.Test != "medium" && a.Test != "long" || a.Seconds < 0 || a.Seconds > MaxDiagSeconds {
				t.Fatalf("%s accepted %+v", raw, a)
			}
		}
	})
}

func TestDecodeArgsRefusesBadIndexes(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{`{"gpu": -1}`, `{"gpu": 1e300}`, `{"gpu": 2.5}`, `{"gpu": "all"}`, `{}`} {
		var args structpb.Struct
		if err := protojson.Unmarshal([]byte(raw), &args); err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeArgs("gpu.reset", &args); err == nil {
			t.Errorf("gpu.reset %s was accepted", raw)
		}
	}
}
