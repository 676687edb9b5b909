package hostagent

import (
	"context"
	"strings"
	"testing"
)

// TestPassThrough: an instance's GPUs are passed through by the PCI address the host reads for
// each UUID (NVML's form normalized), MIG devices by their UUID; a GPU the host does not have,
// or a host that reads none, is refused naming it.
func TestPassThrough(t *testing.T) {
	t.Parallel()
	a := &Agent{opts: Options{GPUs: func(context.Context) (map[string]string, error) {
		return map[string]string{"GPU-a": "00000000:3B:00.0", "GPU-b": "0000:af:00.0", "GPU-c": ""}, nil
	}}}
	got, err := a.passThrough(context.Background(), []string{"GPU-a", "GPU-b", "MIG-1"})
	if err != nil || strings.Join(got, " ") != "0000:3b:00.0 0000:af:00.0 MIG-1" {
		t.Fatalf("passThrough = %v, %v", got, err)
	}
	for _, u := range []string{"GPU-z", "GPU-c"} {
		if _, err := a.passThrough(context.Background(), []string{u}); err == nil || !strings.Contains(err.Error(), u) {
			t.Errorf("GPU %s: %v", u, err)
		}
	}
	if _, err := (&Agent{}).passThrough(context.Background(), []string{"GPU-a"}); err == nil {
		t.Error("a host that reads no GPUs passed one through")
	}
}
