package console_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/better-compute/compute/console"
)

func serve(t *testing.T, h http.Handler, method, path string, hdr map[string]string) *http.Response {
	t.Helper()
	r := httptest.NewRequest(method, path, nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Result()
}

func body(t *testing.T, res *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// errorCode reads the API's error envelope.
func errorCode(t *testing.T, res *http.Response) (code, reason string) {
	t.Helper()
	var e struct {
		Error struct {
			Code    string            `json:"code"`
			Details map[string]string `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body(t, res)), &e); err != nil {
		t.Fatalf("not the API's error envelope: %v", err)
	}
	return e.Error.Code, e.Error.Details["reason"]
}

func TestAssetsAreServedFromTheMount(t *testing.T) {
	t.Parallel()
	h, err := console.New(console.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, typ, contains string
	}{
		{"/console/", "text/html; charset=utf-8", `<script type="module" src="js/app.js">`},
		{"/console/index.html", "text/html; charset=utf-8", "<main"},
		{"/console/style.css", "text/css; charset=utf-8", ":root"},
		{"/console/js/app.js", "text/javascript; charset=utf-8", "import"},
		{"/console/js/views/fleet.js", "text/javascript; charset=utf-8", "FleetMap"},
		{"/console/icon.svg", "image/svg+xml", "<svg"},
		{"/console/config.json", "application/json", `"apiPath":"/api/compute/"`},
	} {
		res := serve(t, h, http.MethodGet, c.path, nil)
		b := body(t, res)
		if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != c.typ || !strings.Contains(b, c.contains) {
			t.Errorf("GET %s = %d %s, %.60q; want 200 %s containing %q", c.path, res.StatusCode, res.Header.Get("Content-Type"), b, c.typ, c.contains)
		}
		if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", c.path, csp)
		}
		if res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no nosniff", c.path)
		}
		// Revalidation answers 304 for the same bytes.
		if again := serve(t, h, http.MethodGet, c.path, map[string]string{"If-None-Match": res.Header.Get("ETag")}); again.StatusCode != http.StatusNotModified {
			t.Errorf("GET %s with its ETag = %d, want 304", c.path, again.StatusCode)
		}
	}
	// The mount without its slash is sent to it; behind StripPrefix the page is found too.
	if res := serve(t, h, http.MethodGet, "/console", nil); res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "/console/" {
		t.Errorf("GET /console = %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	stripped := http.StripPrefix("/ops/console", h)
	if res := serve(t, stripped, http.MethodGet, "/ops/console/js/api.js", nil); res.StatusCode != http.StatusOK {
		t.Errorf("behind StripPrefix: GET js/api.js = %d", res.StatusCode)
	}
	if res := serve(t, h, http.MethodGet, "/console/nothing.js", nil); res.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown asset = %d", res.StatusCode)
	} else if code, _ := errorCode(t, res); code != "not_found" {
		t.Errorf("an unknown asset's code = %q", code)
	}
	if res := serve(t, h, http.MethodPost, "/console/", nil); res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /console/ = %d", res.StatusCode)
	}
}

// The console needs nothing from another origin: no asset names a URL outside the page's own.
func TestAssetsNameNoOtherOrigin(t *testing.T) {
	t.Parallel()
	h, err := console.New(console.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/console/", "/console/style.css", "/console/js/app.js", "/console/js/api.js", "/console/js/fleetmap.js",
		"/console/js/views/reservations.js", "/console/js/views/events.js"} {
		b := body(t, serve(t, h, http.MethodGet, p, nil))
		for _, bad := range []string{"http://", "https://cdn", "//unpkg", "//cdnjs", "fonts.googleapis"} {
			if strings.Contains(b, bad) && !strings.Contains(b, "https://hooks.example.com") {
				t.Errorf("%s names %q", p, bad)
			}
		}
	}
}

func TestSessionIsHandedOnlyToTheConsole(t *testing.T) {
	t.Parallel()
	var asked int
	session := func(r *http.Request) (string, error) {
		asked++
		c, err := r.Cookie("host")
		switch {
		case err != nil:
			return "", console.ErrNoSession
		case c.Value == "broken":
			return "", errors.New("the host's session store is away")
		default:
			return "biam_tok_" + c.Value, nil
		}
	}
	h, err := console.New(console.Options{Session: session, SignInURL: "/login"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg := body(t, serve(t, h, http.MethodGet, "/console/config.json", nil)); !strings.Contains(cfg, `"session":true`) || !strings.Contains(cfg, `"signInUrl":"/login"`) {
		t.Errorf("config.json = %s", cfg)
	}
	own := map[string]string{"X-Better-Compute-Console": "1", "Sec-Fetch-Site": "same-origin"}
	for _, c := range []struct {
		name, method string
		hdr          map[string]string
		status       int
		code, reason string
	}{
		{"a GET", http.MethodGet, own, 405, "invalid_argument", "method_not_allowed"},
		{"no console header", http.MethodPost, map[string]string{"Cookie": "host=alice"}, 403, "permission_denied", "cross_origin"},
		{"another site", http.MethodPost, map[string]string{"X-Better-Compute-Console": "1", "Sec-Fetch-Site": "cross-site", "Cookie": "host=alice"}, 403, "permission_denied", "cross_origin"},
		{"no session", http.MethodPost, own, 401, "unauthenticated", "no_session"},
		{"the host fails", http.MethodPost, map[string]string{"X-Better-Compute-Console": "1", "Cookie": "host=broken"}, 503, "unavailable", "session_unavailable"},
	} {
		res := serve(t, h, c.method, "/console/session", c.hdr)
		code, reason := errorCode(t, res)
		if res.StatusCode != c.status || code != c.code || reason != c.reason {
			t.Errorf("%s: %d %s (%s), want %d %s (%s)", c.name, res.StatusCode, code, reason, c.status, c.code, c.reason)
		}
	}
	if asked != 2 {
		t.Errorf("the host was asked %d times; want only for the two requests from the console itself", asked)
	}
	res := serve(t, h, http.MethodPost, "/console/session", map[string]string{"X-Better-Compute-Console": "1", "Sec-Fetch-Site": "same-origin", "Cookie": "host=alice"})
	if got := body(t, res); res.StatusCode != 200 || !strings.Contains(got, `"credential":"biam_tok_alice"`) || res.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("a signed-in person's session = %d %s (Cache-Control %q)", res.StatusCode, got, res.Header.Get("Cache-Control"))
	}
	// Without the option there is no session to hand.
	keys, _ := console.New(console.Options{})
	if res := serve(t, keys, http.MethodPost, "/console/session", own); res.StatusCode != http.StatusNotFound {
		t.Errorf("session without the option = %d", res.StatusCode)
	}
}

func TestOptionsAreChecked(t *testing.T) {
	t.Parallel()
	for _, o := range []console.Options{{APIPath: "api/compute/"}, {APIPath: "/api/compute"}, {APIPath: "/api?x/"}, {SignInURL: "javascript:alert(1)"}} {
		var oe *console.OptionError
		if _, err := console.New(o); !errors.As(err, &oe) {
			t.Errorf("New(%+v) = %v, want an OptionError", o, err)
		}
	}
	h, err := console.New(console.Options{APIPath: "/compute/api/", Title: "Fleet"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg := body(t, serve(t, h, http.MethodGet, "/console/config.json", nil)); !strings.Contains(cfg, `"apiPath":"/compute/api/"`) || !strings.Contains(cfg, `"title":"Fleet"`) {
		t.Errorf("config.json = %s", cfg)
	}
}
