package hostagent

import (
	"bufio"
	"context"
	"net"
	"strings"
	"time"
)

// readyWatch follows the serial console of a booting warm instance until its guest prints its
// ready line, so that the control plane pauses it only once its guest is up. It holds the
// console while it watches: a warm instance is no one's, so no one else attaches then.
type readyWatch struct {
	line   string
	cancel context.CancelFunc
}

// watchReady starts or stops the watchers so that exactly the instances that have a ready line
// and are not yet ready have one; a.mu is held.
func (a *Agent) watchReady(wanted map[string]string) {
	for id, w := range a.watches {
		if line, ok := wanted[id]; !ok || line != w.line || a.ready[id] {
			w.cancel()
			delete(a.watches, id)
		}
	}
	for id := range a.ready {
		if _, ok := wanted[id]; !ok {
			delete(a.ready, id)
		}
	}
	for id, line := range wanted {
		if _, ok := a.watches[id]; ok || a.ready[id] {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		a.watches[id] = &readyWatch{line: line, cancel: cancel}
		go a.follow(ctx, id, line)
	}
}

// follow dials the instance's console (until it is bound) and reads it until line appears.
func (a *Agent) follow(ctx context.Context, id, line string) {
	for ctx.Err() == nil {
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", a.consolePath(id))
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			if strings.Contains(sc.Text(), line) {
				stop()
				c.Close()
				a.mu.Lock()
				a.ready[id] = true
				if w, ok := a.watches[id]; ok {
					w.cancel()
					delete(a.watches, id)
				}
				a.mu.Unlock()
				a.markDirty()
				return
			}
		}
		stop()
		c.Close()
	}
}
