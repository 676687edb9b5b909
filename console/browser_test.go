package console_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/devserver"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

// screenshots is where the browser tests write a PNG of each view; empty: the test's temporary
// directory. go test ./console -run TestConsole -console.screenshots=docs/console (from the
// module root: ../docs/console) refreshes the documentation's pictures.
var screenshots = flag.String("console.screenshots", "", "write the console's screenshots to this directory")

// chromium finds Debian's Chromium (or another Chrome) or skips the test, saying how to get it.
func chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("BETTER_COMPUTE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("the console's browser tests need Chromium: apt-get install chromium (or set BETTER_COMPUTE_CHROMIUM)")
	return ""
}

// browser is a headless Chromium for the rest of the test; a JavaScript exception on a page
// fails the test.
type browser struct {
	t    testing.TB
	ctx  context.Context
	dir  string
	errs chan string
}

func newBrowser(t testing.TB, width, height int) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, // tests run as root in CI
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("force-device-scale-factor", "1"),
		chromedp.WindowSize(width, height),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b := &browser{t: t, ctx: ctx, dir: *screenshots, errs: make(chan string, 16)}
	if b.dir == "" {
		b.dir = t.TempDir()
	} else if err := os.MkdirAll(b.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() {
				select {
				case b.errs <- m.String():
				default:
				}
			}
		}
	}()
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return b
}

// run runs actions with a deadline, failing the test (with what it was doing) on an error or on
// a JavaScript exception the page threw meanwhile.
func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	err := chromedp.Do(ctx, actions...)
	select {
	case e := <-b.errs:
		b.t.Fatalf("%s: the page threw: %s", what, e)
	default:
	}
	if err != nil {
		loc, _ := chromedp.Run(b.ctx, chromedp.Location())
		b.t.Fatalf("%s: %v (at %s)", what, err, loc)
	}
}

// waitJS waits until a JavaScript expression is truthy.
func waitJS(expr string) chromedp.Action[chromedp.Void] {
	return void(chromedp.Poll[any](expr, chromedp.WithPollingTimeout(20*time.Second), chromedp.WithPollingInterval(50*time.Millisecond)))
}

// void is an action whose value is not wanted.
func void[T any](a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := a(ctx, t)
		return chromedp.Void{}, err
	}
}

// value runs one action that answers a value.
func value[T any](b *browser, what string, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
	return v
}

// eval answers a JavaScript expression's value.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	return value(b, "evaluate "+expr, chromedp.Evaluate[T](expr))
}

// text is the trimmed text of the first element sel matches.
func (b *browser) text(sel string) string {
	b.t.Helper()
	return strings.TrimSpace(value(b, "read "+sel, chromedp.Text(chromedp.CSS(sel))))
}

// shot writes a PNG of the whole page as name.png.
func (b *browser) shot(name string) {
	b.t.Helper()
	// What the page holds painted, its fonts loaded: the second of two animation frames begins
	// after the first one's paint.
	value(b, "settle", chromedp.Evaluate[bool](`document.fonts.ready.then(() => new Promise(done =>
		requestAnimationFrame(() => requestAnimationFrame(() => done(true)))))`, chromedp.EvalAwaitPromise))
	png := value(b, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(b.dir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// set sets a form control's value as typing would, with its input and change events.
func set(sel, v string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.WaitVisible(chromedp.CSS(sel)),
		void(chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const e = document.querySelector(%q); e.value = %q;
			e.dispatchEvent(new Event('input', {bubbles: true})); e.dispatchEvent(new Event('change', {bubbles: true})); return true; })()`, sel, v))),
	)
}

// confirm accepts the confirmation dialog an action opened.
func confirm() chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		waitJS(`document.getElementById('confirm').open`),
		chromedp.Click(chromedp.CSS("#confirm-ok")),
		waitJS(`!document.getElementById('confirm').open`),
	)
}

// view opens a view by its route and waits for its heading.
func view(route string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		void(chromedp.Evaluate[any](fmt.Sprintf(`location.hash = %q`, "#/"+route))),
		waitJS(`document.querySelector('main h1') !== null`),
	)
}

// audit is an accessibility check of the page as it stands: every control, link and canvas has
// an accessible name, no id is used twice, and visible text meets WCAG AA contrast (4.5:1, 3:1
// when large) against the background it is drawn on.
const audit = `(() => {
  const problems = [];
  const visible = (el) => { const r = el.getBoundingClientRect(); return r.width > 1 && r.height > 1 && getComputedStyle(el).visibility !== 'hidden'; };
  const name = (el) => {
    const by = el.getAttribute('aria-labelledby');
    return (el.getAttribute('aria-label') || (by && document.getElementById(by) && document.getElementById(by).textContent) ||
      (el.labels && el.labels.length ? el.labels[0].textContent : '') || (el.tagName === 'INPUT' ? '' : el.textContent) || el.title || '').trim();
  };
  for (const el of document.querySelectorAll('input:not([type=hidden]), select, textarea, button, a[href], canvas, [role=img], progress')) {
    if (el.closest('dialog:not([open])') || !visible(el)) continue;
    if (!name(el)) problems.push('no accessible name: ' + el.outerHTML.slice(0, 100));
  }
  const ids = new Map();
  for (const el of document.querySelectorAll('[id]')) ids.set(el.id, (ids.get(el.id) || 0) + 1);
  for (const [id, n] of ids) if (n > 1) problems.push('id used ' + n + ' times: ' + id);
  const rgb = (s) => { const m = s.match(/rgba?\(([^)]+)\)/); return m ? m[1].split(/[ ,\/]+/).filter(Boolean).map(Number) : null; };
  const lum = (c) => { const f = (x) => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; }; return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const behind = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const cs = getComputedStyle(e);
      if (cs.backgroundImage !== 'none') return null; // a gradient: not judged here
      const c = rgb(cs.backgroundColor);
      if (c && (c.length < 4 || c[3] > 0.9)) return c;
    }
    return [255, 255, 255];
  };
  for (const el of document.querySelectorAll('body *')) {
    if (el.closest('dialog:not([open])') || !visible(el)) continue;
    if (![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    const cs = getComputedStyle(el);
    const fg = rgb(cs.color), bg = behind(el);
    if (!fg || !bg) continue;
    const a = lum(fg), b = lum(bg);
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const size = parseFloat(cs.fontSize), bold = Number(cs.fontWeight) >= 700;
    const need = size >= 24 || (size >= 18.66 && bold) ? 3 : 4.5;
    if (ratio < need) problems.push('contrast ' + ratio.toFixed(2) + ' < ' + need + ': ' + el.tagName.toLowerCase() + ' "' + el.textContent.trim().slice(0, 40) + '"');
  }
  return problems;
})()`

// checkA11y runs the audit and fails the test with what it found.
func (b *browser) checkA11y(what string) {
	b.t.Helper()
	for _, p := range eval[[]string](b, audit) {
		b.t.Errorf("%s: %s", what, p)
	}
}

// startDevserver runs the devserver as `go run ./examples/devserver -sim 2` does, with the metal
// module, on free loopback ports and a fresh database.
func startDevserver(t *testing.T) *devserver.Server {
	t.Helper()
	t.Setenv(postgres.EnvDatabaseURL, pgtest.URL(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := devserver.Start(ctx, devserver.Options{Sim: 2, Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Modules: func(url string) ([]compute.Module, error) {
			m, err := metal.New(metal.Options{JoinURL: url})
			return []compute.Module{m}, err
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})
	return s
}
