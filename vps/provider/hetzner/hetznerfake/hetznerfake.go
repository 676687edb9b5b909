// Package hetznerfake is a small in-memory Hetzner Cloud API for tests of what drives the
// provider (the vps module's provider pools): the servers and SSH keys endpoints the hetzner
// provider calls, answering with the documented status codes and bodies
// (https://docs.hetzner.cloud), with a bearer token it checks. It stands in for a real account,
// which tests never use; what it does not know it answers 404.
package hetznerfake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// Server is a server the fake holds.
type Server struct {
	ID         int64
	Name       string
	Status     string // running, off, ...
	Type       string
	Image      string
	Location   string
	SSHKeys    []int64
	UserData   string
	Labels     map[string]string
	IPv4, IPv6 string
	Created    time.Time
}

// API is the fake. Its URL + "/v1" is an account's endpoint.
type API struct {
	*httptest.Server
	token string

	mu       sync.Mutex
	servers  map[int64]*Server
	keys     map[int64]map[string]any
	nextID   int64
	failNext int // creates to answer 503 before the next one succeeds
	requests []string
}

// Start serves the fake until the test ends; token is the one valid token.
func Start(t testing.TB, token string) *API {
	a := &API{token: token, servers: map[int64]*Server{}, keys: map[int64]map[string]any{}, nextID: 1000}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.Close)
	return a
}

// Endpoint is the account endpoint to give the provider.
func (a *API) Endpoint() string { return a.URL + "/v1" }

// Servers returns the servers the fake holds, by id.
func (a *API) Servers() []Server {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Server, 0, len(a.servers))
	for _, s := range a.servers {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Remove deletes a server behind the control plane's back, as a person in Hetzner's console
// would.
func (a *API) Remove(id int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.servers, id)
}

// Add puts a server there, as another control plane (or a person) would.
func (a *API) Add(s Server) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nextID++
	s.ID = a.nextID
	if s.Status == "" {
		s.Status = "running"
	}
	a.servers[s.ID] = &s
	return s.ID
}

// FailCreates makes the next n server creations answer 503 unavailable.
func (a *API) FailCreates(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failNext = n
}

// Requests returns "METHOD path" of every request so far.
func (a *API) Requests() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.requests...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": code, "message": msg, "details": nil}})
}

func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests = append(a.requests, r.Method+" "+r.URL.Path)
	if r.Header.Get("Authorization") != "Bearer "+a.token {
		apiError(w, http.StatusUnauthorized, "unauthorized", "unable to authenticate")
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/v1")
	switch {
	case path == "/servers" && r.Method == http.MethodGet:
		a.list(w, r)
	case path == "/servers" && r.Method == http.MethodPost:
		a.create(w, r)
	case strings.HasPrefix(path, "/servers/") && r.Method == http.MethodDelete:
		id, _ := strconv.ParseInt(strings.TrimPrefix(path, "/servers/"), 10, 64)
		if a.servers[id] == nil {
			apiError(w, http.StatusNotFound, "not_found", fmt.Sprintf("server with ID '%d' not found", id))
			return
		}
		delete(a.servers, id)
		writeJSON(w, http.StatusOK, map[string]any{"action": action(id, "delete_server")})
	case strings.HasPrefix(path, "/servers/") && strings.HasSuffix(path, "/actions/rebuild") && r.Method == http.MethodPost:
		id, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(path, "/servers/"), "/actions/rebuild"), 10, 64)
		s := a.servers[id]
		if s == nil {
			apiError(w, http.StatusNotFound, "not_found", fmt.Sprintf("server with ID '%d' not found", id))
			return
		}
		var in struct {
			Image any `json:"image"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		s.Image = fmt.Sprint(in.Image)
		writeJSON(w, http.StatusCreated, map[string]any{"action": action(id, "rebuild_server"), "root_password": nil})
	case path == "/ssh_keys" && r.Method == http.MethodGet:
		fp := r.URL.Query().Get("fingerprint")
		keys := []map[string]any{}
		for _, k := range a.keys {
			if fp == "" || k["fingerprint"] == fp {
				keys = append(keys, k)
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"ssh_keys": keys, "meta": meta(1, len(keys), 0)})
	case path == "/ssh_keys" && r.Method == http.MethodPost:
		var in map[string]any
		_ = json.NewDecoder(r.Body).Decode(&in)
		a.nextID++
		k := map[string]any{"id": a.nextID, "name": in["name"], "public_key": in["public_key"], "labels": in["labels"],
			"fingerprint": fingerprintOf(in["public_key"]), "created": time.Now().UTC().Format(time.RFC3339)}
		a.keys[a.nextID] = k
		writeJSON(w, http.StatusCreated, map[string]any{"ssh_key": k})
	default:
		apiError(w, http.StatusNotFound, "not_found", "not found")
	}
}

func (a *API) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sel := q.Get("label_selector")
	var match []*Server
	for _, s := range a.servers {
		if k, v, ok := strings.Cut(sel, "="); sel == "" || (ok && s.Labels[k] == v) {
			match = append(match, s)
		}
	}
	sort.Slice(match, func(i, j int) bool { return match[i].ID < match[j].ID })
	page, _ := strconv.Atoi(q.Get("page"))
	per, _ := strconv.Atoi(q.Get("per_page"))
	if page < 1 {
		page = 1
	}
	if per < 1 {
		per = 25
	}
	from := min((page-1)*per, len(match))
	to := min(from+per, len(match))
	next := 0
	if to < len(match) {
		next = page + 1
	}
	out := make([]map[string]any, 0, to-from)
	for _, s := range match[from:to] {
		out = append(out, body(s))
	}
	writeJSON(w, http.StatusOK, map[string]any{"servers": out, "meta": meta(page, len(match), next)})
}

func (a *API) create(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Name       string            `json:"name"`
		ServerType string            `json:"server_type"`
		Image      any               `json:"image"`
		Location   string            `json:"location"`
		SSHKeys    []int64           `json:"ssh_keys"`
		UserData   string            `json:"user_data"`
		Labels     map[string]string `json:"labels"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		apiError(w, http.StatusBadRequest, "json_error", err.Error())
		return
	}
	if a.failNext > 0 {
		a.failNext--
		apiError(w, http.StatusServiceUnavailable, "unavailable", "service temporarily unavailable")
		return
	}
	if in.ServerType == "" || in.Image == nil {
		apiError(w, http.StatusBadRequest, "invalid_input", "invalid input in fields 'server_type', 'image'")
		return
	}
	for _, s := range a.servers {
		if s.Name == in.Name {
			apiError(w, http.StatusConflict, "uniqueness_error", "server name is already used")
			return
		}
	}
	for _, k := range in.SSHKeys {
		if a.keys[k] == nil {
			apiError(w, http.StatusBadRequest, "invalid_input", fmt.Sprintf("ssh key %d not found", k))
			return
		}
	}
	a.nextID++
	n := a.nextID
	s := &Server{ID: n, Name: in.Name, Status: "running", Type: in.ServerType, Image: fmt.Sprint(in.Image), Location: in.Location,
		SSHKeys: in.SSHKeys, UserData: in.UserData, Labels: in.Labels, Created: time.Now().UTC().Truncate(time.Second),
		IPv4: fmt.Sprintf("203.0.113.%d", n%250+1), IPv6: fmt.Sprintf("2001:db8:%x::/64", n)}
	a.servers[n] = s
	b := body(s)
	b["status"] = "initializing" // what the answer to a create says; a list later says running
	writeJSON(w, http.StatusCreated, map[string]any{"server": b, "action": action(n, "create_server"), "next_actions": []any{}, "root_password": nil})
}

func body(s *Server) map[string]any {
	labels := s.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return map[string]any{"id": s.ID, "name": s.Name, "status": s.Status, "created": s.Created.Format(time.RFC3339),
		"public_net": map[string]any{"ipv4": map[string]any{"id": s.ID, "ip": s.IPv4, "blocked": false, "dns_ptr": ""},
			"ipv6": map[string]any{"id": s.ID + 1, "ip": s.IPv6, "blocked": false, "dns_ptr": []any{}}, "floating_ips": []any{}, "firewalls": []any{}},
		"private_net": []any{}, "server_type": map[string]any{"id": 104, "name": s.Type}, "location": map[string]any{"id": 1, "name": s.Location},
		"image": nil, "iso": nil, "protection": map[string]any{"delete": false, "rebuild": false}, "labels": labels,
		"volumes": []any{}, "load_balancers": []any{}, "primary_disk_size": 40}
}

func action(id int64, command string) map[string]any {
	return map[string]any{"id": id*10 + 1, "command": command, "status": "running", "progress": 0, "started": time.Now().UTC().Format(time.RFC3339),
		"finished": nil, "resources": []any{map[string]any{"id": id, "type": "server"}}, "error": nil}
}

func meta(page, total, next int) map[string]any {
	var n any
	if next > 0 {
		n = next
	}
	return map[string]any{"pagination": map[string]any{"page": page, "per_page": 25, "previous_page": nil, "next_page": n, "last_page": page, "total_entries": total}}
}

// fingerprintOf is the key's MD5 fingerprint, as Hetzner shows it.
func fingerprintOf(v any) string {
	s, _ := v.(string)
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(s))
	if err != nil {
		return ""
	}
	return ssh.FingerprintLegacyMD5(pub)
}
