// Package embedded starts a private PostgreSQL cluster from the machine's PostgreSQL binaries, in
// a data directory of its own, on a free loopback port. It is the database of the devserver and of
// the tests. A new cluster is a copy of a template that initdb made once per machine and kept in
// the user's cache directory (template.go), which makes a cold start several times faster.
package embedded

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
)

// ErrNoBinaries is returned (wrapped) when no PostgreSQL server binaries can be found.
var ErrNoBinaries = errors.New("embedded: PostgreSQL server binaries (initdb, postgres) not found on PATH or under /usr/lib/postgresql/*/bin; install them (Debian/Ubuntu: apt-get install postgresql; macOS: brew install postgresql) or set BETTER_COMPUTE_DATABASE_URL to use an existing server")

// Options configure a cluster. The zero value is an ephemeral cluster in a new temporary directory.
type Options struct {
	// DataDir keeps the cluster's files. Empty: a new temporary directory, removed by Stop. A
	// directory that already holds a cluster is reused, so data survives a restart.
	DataDir string
	// Durable keeps fsync and full page writes on. Off by default: an ephemeral cluster trades
	// crash safety for speed. A cluster in a caller's DataDir is durable regardless.
	Durable bool
	// BinDir is where initdb and postgres are; empty means search PATH, then /usr/lib/postgresql.
	BinDir string
	// StartTimeout bounds how long the server may take to accept connections. Default 30s.
	StartTimeout time.Duration
	// Settings are extra server settings (name → value), passed as -c name=value.
	Settings map[string]string
	// Port is the loopback port to listen on; 0: a free one.
	Port int
	// Password is the superuser's; empty: the one kept in DataDir, or a new random one. A
	// DataDir that keeps another is given this one.
	Password string
	// TemplateDir keeps the cluster template (what initdb makes, once per machine, copied into
	// each new cluster: docs/benchmarks.md); empty: $XDG_CACHE_HOME/better-compute/postgres.
	// A template is copied only when this user made it and no one else may write to it.
	TemplateDir string
	// NoTemplate runs initdb for every new cluster and keeps no template.
	NoTemplate bool
	// Prepare, if set, runs once on a cluster initdb made, as the superuser at url, before the
	// cluster is kept as a template and started for its caller: what it makes (the devserver's
	// migrations) is then in every cluster copied from the template. PrepareKey names what it
	// makes (a hash of the migrations): each key has its own template, and a new key's replaces
	// the last one's. A DataDir that already holds a cluster is not prepared.
	Prepare    func(ctx context.Context, url string) error
	PrepareKey string
}

// validate refuses what the server would take differently from what was asked.
func (o Options) validate() error {
	if o.Port < 0 || o.Port > 65535 {
		return fmt.Errorf("embedded: Port %d: want 1-65535, or 0 for a free one", o.Port)
	}
	if o.Password != strings.TrimSpace(o.Password) || strings.ContainsFunc(o.Password, unicode.IsControl) {
		return errors.New("embedded: Password: no control characters, nor spaces at either end (it is kept in a file of one line)")
	}
	if o.Prepare != nil && o.PrepareKey == "" {
		return errors.New("embedded: PrepareKey: needed with Prepare, to name the template it makes")
	}
	return nil
}

// Cluster is a running PostgreSQL server.
type Cluster struct {
	root      string // what Stop removes, when ephemeral
	dataDir   string
	port      int
	ephemeral bool
	password  string // the superuser's, generated at initdb; the server refuses connections without it
	cmd       *exec.Cmd
	exited    chan struct{}
	waitErr   error
}

// Superuser is the name of the cluster's superuser.
const Superuser = "postgres"

// Start initialises the cluster when its data directory is empty and starts the server.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	bin, err := findBinDir(opts.BinDir)
	if err != nil {
		return nil, err
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 30 * time.Second
	}
	runAs, err := serverUser()
	if err != nil {
		return nil, err
	}
	c := &Cluster{exited: make(chan struct{})}
	if opts.DataDir == "" {
		// Not os.MkdirTemp under a root-owned 0700 directory: the server runs as another user.
		c.root, err = os.MkdirTemp("", "better-compute-pg-")
		if err != nil {
			return nil, fmt.Errorf("embedded: %w", err)
		}
		c.ephemeral = true
		c.dataDir = filepath.Join(c.root, "data")
	} else {
		c.dataDir, err = filepath.Abs(opts.DataDir)
		if err != nil {
			return nil, fmt.Errorf("embedded: data directory: %w", err)
		}
		c.root = c.dataDir
		opts.Durable = true
	}
	if err := c.prepareDir(runAs); err != nil {
		c.cleanup()
		return nil, err
	}
	legacy := false
	want := opts.Password // the superuser's password once started, when it is not what the files hold
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := c.create(ctx, bin, runAs, opts); err != nil {
			c.cleanup()
			return nil, err
		}
	} else if c.password, err = readPassword(c.dataDir); errors.Is(err, os.ErrNotExist) {
		legacy = true // made before clusters had a password: it trusts loopback until secured below
	} else if err != nil {
		c.cleanup()
		return nil, err
	}
	// Files whose password is a template's, even from a start that failed before it gave them
	// their own: every copy its own, never the template's.
	if _, err := os.Stat(filepath.Join(c.dataDir, templatePasswordMark)); err == nil && want == "" {
		want = newPassword()
	}
	// A free port can be taken between our check and the server's bind; try a few.
	for attempt := 0; ; attempt++ {
		err = c.start(ctx, bin, runAs, opts)
		if err == nil || opts.Port != 0 || attempt == 3 || !bindFailed(err) {
			break
		}
	}
	if err != nil && opts.Port != 0 && bindFailed(err) {
		err = fmt.Errorf("embedded: port %d is taken: choose another, or 0 for a free one: %w", opts.Port, err)
	}
	switch {
	case err == nil && legacy:
		if want == "" {
			want = newPassword()
		}
		err = c.secure(ctx, want)
	case err == nil && want != "" && want != c.password:
		err = c.setPassword(ctx, want)
	}
	if err != nil {
		if c.cmd != nil {
			_ = c.Stop(ctx)
		}
		c.cleanup()
		return nil, err
	}
	return c, nil
}

func bindFailed(err error) bool {
	return strings.Contains(err.Error(), "could not bind") || strings.Contains(err.Error(), "Address already in use")
}

// create makes the cluster's files: a copy of the template when one is kept, or else initdb's
// (prepared), then kept as the template for the next cluster. Files whose password is a
// template's are marked (templatePasswordMark): the cluster must not keep it.
func (c *Cluster) create(ctx context.Context, bin string, a *account, opts Options) error {
	tpl := ""
	if dir := cmp.Or(opts.TemplateDir, defaultTemplateDir()); dir != "" && !opts.NoTemplate {
		key, err := templateKey(bin, a, opts.PrepareKey)
		if err != nil {
			return fmt.Errorf("embedded: %w", err)
		}
		tpl = filepath.Join(dir, key)
		if c.fromTemplate(tpl, a) {
			return c.markTemplatePassword()
		}
	}
	if err := c.initdb(ctx, bin, a); err != nil {
		return err
	}
	if opts.Prepare != nil {
		if err := c.prepare(ctx, bin, a, opts); err != nil {
			return err
		}
	}
	if tpl == "" {
		return nil
	}
	_ = c.keepTemplate(tpl) // a cache: without it, the next cluster runs initdb too
	return c.markTemplatePassword()
}

// templatePasswordMark, in a data directory, says that its password is a template's, until
// setPassword gives it its own: a start that fails before then leaves it for the next.
const templatePasswordMark = "better-compute.password-is-shared"

func (c *Cluster) markTemplatePassword() error {
	if err := os.WriteFile(filepath.Join(c.dataDir, templatePasswordMark), nil, 0o600); err != nil {
		return fmt.Errorf("embedded: %w", err)
	}
	return nil
}

// prepare starts the server on a free port, runs opts.Prepare and stops the server cleanly (a
// checkpoint: its files are then whole, to copy).
func (c *Cluster) prepare(ctx context.Context, bin string, a *account, opts Options) error {
	opts.Port = 0
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		if err = c.start(ctx, bin, a, opts); err == nil || !bindFailed(err) {
			break
		}
	}
	if err != nil {
		return err
	}
	if err := opts.Prepare(ctx, c.URL("postgres")); err != nil {
		_ = c.stopServer(ctx)
		return fmt.Errorf("embedded: prepare the cluster: %w", err)
	}
	return c.stopServer(ctx)
}

// Port is the loopback TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// URL returns a connection URL for database as the superuser, with its password.
func (c *Cluster) URL(database string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(Superuser, c.password), Host: fmt.Sprintf("127.0.0.1:%d", c.port),
		Path: "/" + database, RawQuery: "sslmode=disable"}
	if c.password == "" {
		u.User = url.User(Superuser)
	}
	return u.String()
}

// Stop shuts the server down (fast shutdown: open sessions are ended) and, for an ephemeral
// cluster, removes its files. It waits until ctx is done, then kills the server.
func (c *Cluster) Stop(ctx context.Context) error {
	err := c.stopServer(ctx)
	c.cleanup()
	return err
}

// stopServer stops the server (fast shutdown: a checkpoint, then exit), or kills it once ctx is
// done.
func (c *Cluster) stopServer(ctx context.Context) error {
	if c.cmd == nil || c.cmd.Process == nil {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.exited:
		return nil
	case <-ctx.Done():
		_ = c.cmd.Process.Kill()
		<-c.exited
		return fmt.Errorf("embedded: server did not stop in time, killed: %w", ctx.Err())
	}
}

func (c *Cluster) cleanup() {
	if c.ephemeral && c.root != "" {
		os.RemoveAll(c.root)
	}
}

// runAs is the account the server runs as: nil for the current user.
type account struct{ uid, gid uint32 }

// serverUser returns the account initdb and postgres must run as. They refuse to run as root, so
// a root process runs them as the postgres system user.
func serverUser() (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("embedded: running as root, the server must run as the postgres system user, which does not exist (%w); create it (useradd --system postgres) or run as another user", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &account{uint32(uid), uint32(gid)}, nil
}

func (c *Cluster) prepareDir(a *account) error {
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return fmt.Errorf("embedded: create data directory: %w", err)
	}
	if a == nil {
		return nil
	}
	for _, d := range []string{c.root, c.dataDir} {
		if err := os.Chown(d, int(a.uid), int(a.gid)); err != nil {
			return fmt.Errorf("embedded: give %s to the postgres user: %w", d, err)
		}
	}
	// The postgres user must be able to reach the directory through its parents.
	for dir := filepath.Dir(c.root); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err == nil && fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("embedded: the postgres user cannot enter %s (mode %v), which holds the data directory %s; choose a data directory under a path others can traverse, such as /var/tmp", dir, fi.Mode().Perm(), c.dataDir)
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}

func (c *Cluster) command(ctx context.Context, a *account, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.root
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Ctrl-C reaches us, not the server
	if a != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: a.uid, Gid: a.gid}
	}
	return cmd
}

// initdb makes the cluster with a generated superuser password and scram-sha-256 for every
// connection: any local user can reach a loopback port, so none is trusted.
func (c *Cluster) initdb(ctx context.Context, bin string, a *account) error {
	c.password = newPassword()
	// The password file must not be in the data directory (initdb wants it empty) and must be
	// readable by the server's user only.
	pw, err := os.CreateTemp("", "better-compute-pw-")
	if err != nil {
		return fmt.Errorf("embedded: password file: %w", err)
	}
	defer os.Remove(pw.Name())
	_, err = pw.WriteString(c.password + "\n")
	if cerr := pw.Close(); err == nil {
		err = cerr
	}
	if err == nil && a != nil {
		err = os.Chown(pw.Name(), int(a.uid), int(a.gid))
	}
	if err != nil {
		return fmt.Errorf("embedded: password file: %w", err)
	}
	cmd := c.command(ctx, a, filepath.Join(bin, "initdb"), append([]string{"-D", c.dataDir, "--pwfile", pw.Name()}, initdbArgs...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("embedded: initdb failed: %w\n%s", err, out)
	}
	return writePassword(c.dataDir, c.password)
}

// passwordFile keeps the superuser password beside the cluster, readable by its owner only, so a
// reused DataDir opens with it.
const passwordFile = "better-compute.password"

func newPassword() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func readPassword(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, passwordFile))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func writePassword(dataDir, pw string) error {
	if err := os.WriteFile(filepath.Join(dataDir, passwordFile), []byte(pw+"\n"), 0o600); err != nil {
		return fmt.Errorf("embedded: keep the password: %w", err)
	}
	return nil
}

// hbaConf allows password (scram-sha-256) connections only.
const hbaConf = `# Written by Better Compute's embedded PostgreSQL: every connection needs the password.
local all all scram-sha-256
host  all all 127.0.0.1/32 scram-sha-256
host  all all ::1/128 scram-sha-256
`

// secure gives a cluster made before passwords (loopback trusted) the password pw and
// scram-sha-256 authentication, and reloads it.
func (c *Cluster) secure(ctx context.Context, pw string) error {
	if err := c.setPassword(ctx, pw); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("embedded: secure the cluster: %w", err)
	}
	defer conn.Close(ctx)
	if err := os.WriteFile(filepath.Join(c.dataDir, "pg_hba.conf"), []byte(hbaConf), 0o600); err != nil {
		return fmt.Errorf("embedded: write pg_hba.conf: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return fmt.Errorf("embedded: reload: %w", err)
	}
	return nil
}

// setPassword gives the superuser the password pw, and keeps it beside the cluster.
func (c *Cluster) setPassword(ctx context.Context, pw string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("embedded: set the password: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SET password_encryption = 'scram-sha-256'`); err != nil {
		return fmt.Errorf("embedded: set the password: %w", err)
	}
	var stmt string // ALTER ROLE takes no parameters: the password is quoted by the server
	if err := conn.QueryRow(ctx, `SELECT format('ALTER ROLE %I PASSWORD %L', $1::text, $2::text)`, Superuser, pw).Scan(&stmt); err != nil {
		return fmt.Errorf("embedded: set the password: %w", err)
	}
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("embedded: set the password: %w", err)
	}
	if err := writePassword(c.dataDir, pw); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(c.dataDir, templatePasswordMark)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("embedded: %w", err)
	}
	c.password = pw
	return nil
}

func (c *Cluster) start(ctx context.Context, bin string, a *account, opts Options) error {
	port := opts.Port
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return err
		}
	}
	c.port = port
	settings := map[string]string{
		"listen_addresses":          "127.0.0.1",
		"port":                      strconv.Itoa(port),
		"unix_socket_directories":   "", // TCP only: socket paths have a short length limit
		"max_connections":           "400",
		"shared_buffers":            "128MB",
		"log_min_messages":          "warning",
		"max_locks_per_transaction": "256",
	}
	if !opts.Durable {
		settings["fsync"] = "off"
		settings["synchronous_commit"] = "off"
		settings["full_page_writes"] = "off"
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	args := []string{"-D", c.dataDir}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	logPath := filepath.Join(c.root, "postgres.log")
	if !c.ephemeral {
		logPath = filepath.Join(c.dataDir, "postgres.log")
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("embedded: server log: %w", err)
	}
	defer logFile.Close()

	// The server runs until Stop, not until ctx ends. It is started from a goroutine locked to
	// its OS thread so that Pdeathsig (which follows the thread, not the process) stops the server
	// if this process dies without calling Stop.
	started := make(chan error, 1)
	c.exited = make(chan struct{})
	go func() {
		runtime.LockOSThread()
		cmd := c.command(context.Background(), a, filepath.Join(bin, "postgres"), args...)
		cmd.SysProcAttr.Pdeathsig = syscall.SIGINT
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("embedded: start postgres: %w", err)
			close(c.exited)
			return
		}
		c.cmd = cmd
		started <- nil
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	if err := <-started; err != nil {
		return err
	}
	return c.waitReady(ctx, opts.StartTimeout, logPath)
}

func (c *Cluster) waitReady(ctx context.Context, timeout time.Duration, logPath string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			// A chosen port may be another server's, ours having failed to bind it.
			var dir string
			err = conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir)
			conn.Close(ctx)
			if err == nil && dir == c.dataDir {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("port %d is answered by the server of %s", c.port, dir)
			}
		}
		select {
		case <-c.exited:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("embedded: postgres exited before accepting connections (%v):\n%s", c.waitErr, tail(log, 2000))
		case <-ctx.Done():
			_ = c.cmd.Process.Kill()
			<-c.exited
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("embedded: postgres did not accept connections within %v: %w\n%s", timeout, err, tail(log, 2000))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("embedded: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// findBinDir returns the directory holding initdb and postgres.
func findBinDir(dir string) (string, error) {
	ok := func(d string) bool {
		for _, n := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(d, n)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if dir != "" {
		if ok(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("%w (looked in BinDir %s)", ErrNoBinaries, dir)
	}
	if p, err := exec.LookPath("initdb"); err == nil && ok(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	// Debian and Ubuntu keep the server binaries off PATH; take the newest version installed.
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if ok(d) {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// Server returns the URL of a server to use: BETTER_COMPUTE_DATABASE_URL when it is set, or else
// a new cluster started with opts. stop ends what Server started, and does nothing for a server
// named by the environment.
func Server(ctx context.Context, opts Options) (url string, stop func(context.Context) error, err error) {
	if u := os.Getenv("BETTER_COMPUTE_DATABASE_URL"); u != "" {
		return u, func(context.Context) error { return nil }, nil
	}
	c, err := Start(ctx, opts)
	if err != nil {
		return "", nil, err
	}
	return c.URL("postgres"), c.Stop, nil
}
