// Package console is Better Compute's web console: a page served from assets embedded in the
// binary (plain HTML, CSS and ES modules, no build step and nothing fetched from elsewhere) that
// signs a person in with an API key, or with a credential the host hands over for its own
// session, and then calls the public API like any other client. It has no privileged path: every
// view is a call of the API with the person's credential, decided by IAM.
//
// compute.New builds one (Compute.ConsoleHandler, configured by compute.Options.Console); a host
// mounts it at Path beside the API:
//
//	mux.Handle("/api/compute/", c.Handler)
//	mux.Handle(console.Path, c.ConsoleHandler)
package console

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strings"
)

// Path is where the console expects to be mounted. It also works mounted elsewhere, or behind
// http.StripPrefix: its pages name their assets by relative URLs and route in the URL's fragment.
const Path = "/console/"

// DefaultAPIPath is where the console calls the API unless Options.APIPath says otherwise.
const DefaultAPIPath = "/api/compute/"

// ErrNoSession is what a Session function answers for a request with no signed-in person: the
// console then asks for an API key (or sends the person to Options.SignInURL).
var ErrNoSession = errors.New("console: no session")

// OptionError is the error of New for an invalid Options field.
type OptionError struct {
	Field   string // e.g. "APIPath"
	Problem string
}

func (e *OptionError) Error() string { return "console: Options." + e.Field + " " + e.Problem }

// Options configure a console. The zero value signs in with API keys only and calls the API at
// DefaultAPIPath on the page's own origin.
type Options struct {
	// APIPath is the path the public API (compute.Compute.Handler) is mounted at, on the
	// console's origin, ending in "/". Default DefaultAPIPath.
	APIPath string
	// Session lets a person signed in to the host use the console without an API key. The
	// console asks for it (POST <mount>/session, same-origin only) when the page opens; Session
	// answers a credential the API accepts for the person behind r (typically a short-lived
	// IAM token the host mints for its own cookie session), or ErrNoSession. The credential is
	// handed to the page, kept in the browser's session storage and sent as a bearer token like
	// a key: IAM decides every call with it. Nil: API keys only.
	Session func(r *http.Request) (credential string, err error)
	// SignInURL, if set, is offered to a person without a session: the host's own sign-in page.
	SignInURL string
	// Title names the console in its header and the page's title. Default "Better Compute".
	Title string
}

//go:embed assets
var assets embed.FS

// config is what the page reads at start (GET <mount>/config.json).
type config struct {
	APIPath   string `json:"apiPath"`
	Session   bool   `json:"session"`
	SignInURL string `json:"signInUrl,omitempty"`
	Title     string `json:"title"`
}

// New returns the console's handler, or an error naming the option that is wrong.
func New(o Options) (http.Handler, error) {
	if o.APIPath == "" {
		o.APIPath = DefaultAPIPath
	}
	if !strings.HasPrefix(o.APIPath, "/") || !strings.HasSuffix(o.APIPath, "/") || strings.ContainsAny(o.APIPath, "?#") {
		return nil, &OptionError{Field: "APIPath", Problem: fmt.Sprintf("%q must be a path that starts and ends with /", o.APIPath)}
	}
	if o.SignInURL != "" {
		if u, err := url.Parse(o.SignInURL); err != nil || (u.Scheme != "" && u.Scheme != "http" && u.Scheme != "https") {
			return nil, &OptionError{Field: "SignInURL", Problem: fmt.Sprintf("%q is not an http(s) URL or a path", o.SignInURL)}
		}
	}
	if o.Title == "" {
		o.Title = "Better Compute"
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	files, err := load(sub)
	if err != nil {
		return nil, err
	}
	cfg, err := json.Marshal(config{APIPath: o.APIPath, Session: o.Session != nil, SignInURL: o.SignInURL, Title: o.Title})
	if err != nil {
		return nil, err
	}
	files["config.json"] = newFile("config.json", cfg)
	return &handler{o: o, files: files}, nil
}

// file is an embedded asset, ready to serve.
type file struct {
	body []byte
	typ  string
	etag string
}

func newFile(name string, body []byte) file {
	sum := sha256.Sum256(body)
	typ := mime.TypeByExtension(path.Ext(name))
	switch path.Ext(name) { // not left to the machine's MIME table
	case ".js":
		typ = "text/javascript; charset=utf-8"
	case ".css":
		typ = "text/css; charset=utf-8"
	case ".html":
		typ = "text/html; charset=utf-8"
	case ".json":
		typ = "application/json"
	case ".svg":
		typ = "image/svg+xml"
	}
	return file{body: body, typ: typ, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
}

// load reads every asset into memory once: they are small, and served with their hashes as ETags.
func load(fsys fs.FS) (map[string]file, error) {
	files := map[string]file{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		files[p] = newFile(p, b)
		return nil
	})
	return files, err
}

type handler struct {
	o     Options
	files map[string]file
}

// contentSecurity lets the page load only its own scripts, styles and images and talk only to
// its own origin: no inline script, no frame around it.
const contentSecurity = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == strings.TrimSuffix(Path, "/") {
		// The page's relative URLs need the mount's trailing slash.
		http.Redirect(w, r, Path, http.StatusMovedPermanently)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, Path)
	if !ok { // behind http.StripPrefix
		name = strings.TrimPrefix(r.URL.Path, "/")
	}
	hd := w.Header()
	hd.Set("Content-Security-Policy", contentSecurity)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	if name == "session" {
		h.serveSession(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hd.Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "invalid_argument", r.Method+" is not allowed here", "method_not_allowed")
		return
	}
	if name == "" {
		name = "index.html"
	}
	f, ok := h.files[name]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", "the console has no "+name, "unknown_asset")
		return
	}
	hd.Set("Content-Type", f.typ)
	hd.Set("ETag", f.etag)
	hd.Set("Cache-Control", "no-cache") // revalidated: a new binary's assets show at once
	if match := r.Header.Get("If-None-Match"); match != "" && match == f.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(f.body)
}

// serveSession answers the host's credential for the person behind the request: POST only,
// from the console's own origin (a custom header, which a cross-origin page cannot send without a
// preflight the console never answers, and Sec-Fetch-Site where the browser sends it).
func (h *handler) serveSession(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case h.o.Session == nil:
		writeError(w, http.StatusNotFound, "not_found", "this console signs in with API keys only", "no_session_option")
		return
	case r.Method != http.MethodPost:
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "invalid_argument", r.Method+" is not allowed: POST the session", "method_not_allowed")
		return
	case r.Header.Get("X-Better-Compute-Console") != "1",
		r.Header.Get("Sec-Fetch-Site") != "" && r.Header.Get("Sec-Fetch-Site") != "same-origin":
		writeError(w, http.StatusForbidden, "permission_denied", "the session is handed only to the console's own pages", "cross_origin")
		return
	}
	cred, err := h.o.Session(r)
	if errors.Is(err, ErrNoSession) || (err == nil && cred == "") {
		writeError(w, http.StatusUnauthorized, "unauthenticated", "no one is signed in to the host", "no_session")
		return
	}
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the host could not read its session: try again", "session_unavailable")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"credential": cred})
}

// writeError answers in the API's error shape, so the page shows every error the same way.
func writeError(w http.ResponseWriter, status int, code, message, reason string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": message, "details": map[string]string{"reason": reason}}})
}
