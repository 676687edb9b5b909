package ramdisk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

// maxAnswer is the most of an API answer the ramdisk reads.
const maxAnswer = 1 << 20

// call makes one request of the site's ramdisk API, with the token as a bearer when there is
// one, and returns the answer's status and body. An error is the network's (worth retrying).
func (a *Agent) call(ctx context.Context, method, path, token string, in any) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, nil, fmt.Errorf("encoding %s: %w", path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.cfg.Site+path, body)
	if err != nil {
		return 0, nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := a.cfg.Client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return 0, nil, fmt.Errorf("reading the answer to %s %s: %w", method, path, err)
	}
	return resp.StatusCode, b, nil
}

// hello says Hello with the latest facts until the site names the machine and gives its token
// (retrying with backoff while the site does not answer, and every PollInterval while it does
// not know the machine), unless another Hello has already replaced stale, the token a request
// was refused with ("" to say Hello regardless). It returns an error only when ctx is done.
func (a *Agent) hello(ctx context.Context, stale string) error {
	a.helloMu.Lock()
	defer a.helloMu.Unlock()
	if _, token := a.identity(); stale != "" && token != stale {
		return nil // someone else's Hello already brought a new token
	}
	b := backoff{max: a.cfg.RetryMax}
	for {
		a.mu.Lock()
		h := siteapi.Hello{Machine: a.machine, Token: a.token, Facts: a.facts}
		a.mu.Unlock()
		status, body, err := a.call(ctx, http.MethodPost, siteapi.PathHello, "", h)
		var ans siteapi.HelloAnswer
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			a.log.Warn("ramdisk: hello: the site does not answer; retrying", "err", err)
		case status != http.StatusOK:
			a.log.Warn("ramdisk: hello: the site refused; retrying", "status", status, "answer", short(body))
		case json.Unmarshal(body, &ans) != nil:
			a.log.Warn("ramdisk: hello: the site's answer is not a HelloAnswer; retrying", "answer", short(body))
		case ans.Machine == "" || ans.Token == "":
			a.log.Info("ramdisk: hello: the site does not know this machine yet (it is reported); saying Hello again later", "every", a.cfg.PollInterval)
			b.reset()
			if err := sleep(ctx, a.cfg.PollInterval); err != nil {
				return err
			}
			continue
		default:
			a.mu.Lock()
			if a.machine != ans.Machine {
				a.log.Info("ramdisk: hello: the site knows this machine", "machine", ans.Machine)
			}
			a.machine, a.token = ans.Machine, ans.Token
			a.mu.Unlock()
			return nil
		}
		if err := b.wait(ctx); err != nil {
			return err
		}
	}
}

// nextTask asks the site for the machine's task until it has one: waiting PollInterval while
// there is none (204), saying Hello again when the token is refused (401), retrying with
// backoff when the site does not answer. It returns an error only when ctx is done.
func (a *Agent) nextTask(ctx context.Context) (siteapi.Task, error) {
	b := backoff{max: a.cfg.RetryMax}
	for {
		machine, token := a.identity()
		status, body, err := a.call(ctx, http.MethodGet, siteapi.PathTask+"?machine="+url.QueryEscape(machine), token, nil)
		var task siteapi.Task
		switch {
		case ctx.Err() != nil:
			return task, ctx.Err()
		case err != nil:
			a.log.Warn("ramdisk: task: the site does not answer; retrying", "err", err)
		case status == http.StatusOK:
			if err := json.Unmarshal(body, &task); err != nil {
				a.log.Error("ramdisk: task: the site's answer is not a task; asking again", "err", err, "answer", short(body))
				break
			}
			return task, nil
		case status == http.StatusNoContent:
			b.reset()
			if err := sleep(ctx, a.cfg.PollInterval); err != nil {
				return task, err
			}
			continue
		case status == http.StatusUnauthorized:
			a.log.Info("ramdisk: task: the site refused the token; saying Hello again for a new one")
			if err := a.hello(ctx, token); err != nil {
				return task, err
			}
			continue
		default:
			a.log.Warn("ramdisk: task: the site refused; retrying", "status", status, "answer", short(body))
		}
		if err := b.wait(ctx); err != nil {
			return task, err
		}
	}
}

// postProgress posts one Progress until the site takes it: retried with backoff while the
// site does not answer or is not ready (503: the control plane has not recorded it yet), after
// a new Hello when the token is refused. Only progress the site calls invalid (400) or the
// control plane refused (409) is dropped, with an error logged.
func (a *Agent) postProgress(ctx context.Context, p siteapi.Progress) {
	b := backoff{max: a.cfg.RetryMax}
	for {
		_, token := a.identity()
		status, body, err := a.call(ctx, http.MethodPost, siteapi.PathProgress, token, p)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			a.log.Warn("ramdisk: progress: the site does not answer; retrying", "err", err, "phase", p.Phase)
		case status == http.StatusNoContent || status == http.StatusOK:
			return
		case status == http.StatusUnauthorized:
			if a.hello(ctx, token) != nil {
				return
			}
			continue
		case status == http.StatusBadRequest || status == http.StatusConflict:
			// Invalid, or refused for good by the control plane (a task the machine no longer
			// has): posting it again would not help.
			a.log.Error("ramdisk: progress: refused for good; dropped", "status", status, "progress", p, "answer", short(body))
			return
		default:
			a.log.Warn("ramdisk: progress: the site refused; retrying", "status", status, "answer", short(body), "phase", p.Phase)
		}
		if b.wait(ctx) != nil {
			return
		}
	}
}

// short is the start of an answer, for a log line.
func short(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return string(bytes.TrimSpace(b))
}

// backoff is the wait between retries: max/32 at first, doubled at each failure up to max,
// each wait drawn from 75% to 125% of that.
type backoff struct {
	max, cur time.Duration
}

func (b *backoff) wait(ctx context.Context) error {
	if b.cur == 0 {
		b.cur = max(b.max/32, time.Millisecond)
	}
	d := time.Duration(float64(b.cur) * (0.75 + rand.Float64()/2))
	b.cur = min(b.cur*2, b.max)
	return sleep(ctx, d)
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits d, or less when ctx is done, which it returns.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
