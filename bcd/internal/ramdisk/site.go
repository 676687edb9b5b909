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

// hello says Hello with the latest facts until the site names the machine (retrying with
// backoff while the site does not answer or refuses, and every PollInterval while it does not
// know the machine). It returns an error only when ctx is done.
func (a *Agent) hello(ctx context.Context) error {
	a.helloMu.Lock()
	defer a.helloMu.Unlock()
	b := backoff{max: a.cfg.RetryMax}
	for {
		a.mu.Lock()
		h, token := siteapi.Hello{Machine: a.machine, Facts: a.facts}, a.token
		a.mu.Unlock()
		status, body, err := a.call(ctx, http.MethodPost, siteapi.PathHello, token, h)
		var ans siteapi.HelloAnswer
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			a.log.Warn("ramdisk: hello: the site does not answer; retrying", "err", err)
		case refusedBoot(status):
			a.log.Error("ramdisk: hello: the site refuses this boot's token (the machine booted again since, or the site forgot its boots, or this is not the address of its lease): PXE-boot the machine again; retrying",
				"status", status, "answer", short(body))
		case status != http.StatusOK:
			a.log.Warn("ramdisk: hello: the site refused; retrying", "status", status, "answer", short(body))
		case json.Unmarshal(body, &ans) != nil:
			a.log.Warn("ramdisk: hello: the site's answer is not a HelloAnswer; retrying", "answer", short(body))
		case ans.Machine == "":
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
			a.machine = ans.Machine
			a.mu.Unlock()
			return nil
		}
		if err := b.wait(ctx); err != nil {
			return err
		}
	}
}

// refusedBoot is an answer refusing the boot's token (401) or its use (403: from another
// address, or for another machine than the boot's).
func refusedBoot(status int) bool {
	return status == http.StatusUnauthorized || status == http.StatusForbidden
}

// nextTask asks the site for the machine's task until it has one: waiting PollInterval while
// there is none (204), saying Hello again when it is refused (401, 403: the machine's id may
// have changed), retrying with backoff when the site does not answer. It returns an error only
// when ctx is done.
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
		case refusedBoot(status):
			a.log.Info("ramdisk: task: the site refused; saying Hello again", "status", status, "answer", short(body))
			if err := a.hello(ctx); err != nil {
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
// a new Hello when it is refused (401, 403). Only progress the site calls invalid (400) or the
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
		case refusedBoot(status):
			if a.hello(ctx) != nil {
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

// credentialAttempts is how many times the ramdisk asks for a join credential while the site
// does not answer (or answers 5xx), before the task fails.
const credentialAttempts = 5

// withJoinCredential is a kexec task's command line with its join credential, which the site
// hands over apart from the task (to this boot alone), as bcd.join= (siteapi.SetCmdline: once,
// before the image's own arguments). A task without one keeps its command line.
func (a *Agent) withJoinCredential(ctx context.Context, task siteapi.Task) (string, error) {
	b := backoff{max: a.cfg.RetryMax}
	for attempt := 1; ; attempt++ {
		machine, token := a.identity()
		status, body, err := a.call(ctx, http.MethodPost, siteapi.PathCredential, token, siteapi.CredentialRequest{Machine: machine, Task: task.ID})
		var ans siteapi.CredentialAnswer
		switch {
		case ctx.Err() != nil:
			return "", ctx.Err()
		case err == nil && status == http.StatusNoContent:
			return task.Cmdline, nil
		case err == nil && status == http.StatusOK:
			if err := json.Unmarshal(body, &ans); err != nil || ans.JoinCredential == "" {
				return "", fmt.Errorf("ramdisk: the site's answer for the join credential is not one: %s", short(body))
			}
			return siteapi.SetCmdline(task.Cmdline, siteapi.CmdlineParam{Name: siteapi.CmdlineJoin, Value: ans.JoinCredential})
		case err == nil && status < 500:
			return "", fmt.Errorf("ramdisk: the site refused the join credential of task %s: %d %s", task.ID, status, short(body))
		case attempt == credentialAttempts:
			return "", fmt.Errorf("ramdisk: the join credential of task %s: %d answers, the last %d %s (%v)", task.ID, attempt, status, short(body), err)
		}
		a.log.Warn("ramdisk: the join credential: the site does not answer; retrying", "status", status, "err", err)
		if err := b.wait(ctx); err != nil {
			return "", err
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
