package selfupdate

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

func TestUpdaterTakesTheReleasePart(t *testing.T) {
	t.Parallel()
	s := Slots{Dir: t.TempDir()}
	u, err := New(Config{Slots: s, Version: "v1", MetadataDir: t.TempDir(), Restart: func(string) {},
		Identity: func() (nodeagent.Identity, bool, error) { return nodeagent.Identity{}, false, nil }})
	if err != nil {
		t.Fatal(err)
	}
	conv := u.Extension().Desired[api.BCDReleaseKind]
	apply := func(r api.BCDRelease) error {
		b, _ := json.Marshal(r)
		return conv(context.Background(), api.BCDReleaseVersion, b)
	}
	if err := apply(api.BCDRelease{Version: "v1", Rollout: "r", Attempt: 1}); err != nil || u.Status().Wanted != "" {
		t.Fatalf("the running release: %v, wanted %q", err, u.Status().Wanted)
	}
	if err := apply(api.BCDRelease{Version: "v2", Rollout: "r", Attempt: 1}); err != nil || u.Status().Wanted != "v2" {
		t.Fatalf("another release: %v, wanted %q", err, u.Status().Wanted)
	}
	if err := conv(context.Background(), api.BCDReleaseVersion, nil); err != nil || u.Status().Wanted != "" {
		t.Fatalf("no part: %v, wanted %q", err, u.Status().Wanted)
	}
	if err := conv(context.Background(), 2, []byte(`{"version":"v2"}`)); err == nil {
		t.Fatal("a payload version this bcd does not know was taken")
	}
	if err := apply(api.BCDRelease{Version: "../x"}); err == nil {
		t.Fatal("a malformed version was taken")
	}
	// A try rolled back here is refused, with the reason; a new try of the same release is taken.
	if err := writeJSON(s.rollbackPath(), Rollback{Version: "v2", Try: "v2/r#1", Reason: "it exited during its trial", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// Not an error of the desired state: the parts after it must still converge.
	if err := apply(api.BCDRelease{Version: "v2", Rollout: "r", Attempt: 1}); err != nil || u.Status().Wanted != "" ||
		!strings.Contains(u.Status().Refused, "rolled back") || !strings.Contains(u.Status().Refused, "it exited during its trial") {
		t.Fatalf("a try rolled back: %v, status %+v", err, u.Status())
	}
	if err := apply(api.BCDRelease{Version: "v2", Rollout: "r", Attempt: 2}); err != nil || u.Status().Wanted != "v2" || u.Status().Refused != "" {
		t.Fatalf("a new try: %v, wanted %q", err, u.Status().Wanted)
	}
}
