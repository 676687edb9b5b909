package client

import (
	"errors"
	"testing"
	"time"
)

// TestTunnelConnRefusesDeadlines: a deadline on a tunnel's net.Conn is refused by name (it has
// none, and silently ignoring one left a caller waiting past it); clearing one is accepted.
func TestTunnelConnRefusesDeadlines(t *testing.T) {
	t.Parallel()
	c := &tunnelConn{}
	at := time.Now().Add(time.Second)
	for name, set := range map[string]func(time.Time) error{"SetDeadline": c.SetDeadline, "SetReadDeadline": c.SetReadDeadline, "SetWriteDeadline": c.SetWriteDeadline} {
		if err := set(at); !errors.Is(err, ErrTunnelDeadline) {
			t.Errorf("%s(a time) = %v, want ErrTunnelDeadline", name, err)
		}
		if err := set(time.Time{}); err != nil {
			t.Errorf("%s(zero) = %v, want nil", name, err)
		}
	}
}
