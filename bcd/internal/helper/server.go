package helper

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/bcd/internal/hardware"
)

// DefaultCDIRoots are the spec directories container runtimes read (the CDI specification's).
var DefaultCDIRoots = []string{"/etc/cdi", "/var/run/cdi"}

// Config is what a helper serves.
type Config struct {
	// AllowUID is the one uid whose processes may call (the node agent's).
	AllowUID int
	// CDIRoots are the directories specs may be written in; default DefaultCDIRoots.
	CDIRoots []string
	// Policy is what a spec may hold (its Hook: the bcd binary whose cgroup-hook may run).
	Policy cdi.SpecPolicy
	// MIG makes MIG changes; nil: none (mig.* answer unavailable, saying Why).
	MIG hardware.MIG
	// Reset resets a GPU; nil: gpu.reset answers unavailable.
	Reset func(ctx context.Context, gpu int) error
	// Why MIG or Reset is nil, for the answer.
	Why    string
	Logger *slog.Logger
}

// Server is a running helper's command table.
type Server struct {
	cfg Config
	mu  sync.Mutex // one action at a time: NVML's MIG calls, a spec's file
}

// New checks cfg and returns a server.
func New(cfg Config) (*Server, error) {
	if cfg.AllowUID < 0 {
		return nil, fmt.Errorf("helper: the allowed uid %d is not a uid", cfg.AllowUID)
	}
	if len(cfg.CDIRoots) == 0 {
		cfg.CDIRoots = DefaultCDIRoots
	}
	roots := make([]string, 0, len(cfg.CDIRoots))
	for _, r := range cfg.CDIRoots {
		if !filepath.IsAbs(r) {
			return nil, fmt.Errorf("helper: the spec directory %q is not an absolute path", r)
		}
		roots = append(roots, filepath.Clean(r))
	}
	cfg.CDIRoots = roots
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg}, nil
}

// Listen makes the helper's socket at path, replacing a stale socket (never another kind of
// file). Anyone may connect; the helper answers only the allowed uid (SO_PEERCRED).
func Listen(path string) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("helper: %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("helper: listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Serve answers connections on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln *net.UnixListener) error {
	for _, r := range s.cfg.CDIRoots {
		if err := os.MkdirAll(r, 0o755); err != nil {
			return fmt.Errorf("helper: spec directory %s: %w", r, err)
		}
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			stopConn := context.AfterFunc(ctx, func() { conn.Close() })
			defer stopConn()
			s.serveConn(ctx, conn)
		}()
	}
}

// peer is the credentials of the process at the other end of conn.
func peer(conn *net.UnixConn) (*unix.Ucred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, credErr
}

func (s *Server) serveConn(ctx context.Context, conn *net.UnixConn) {
	w := bufio.NewWriter(conn)
	answer := func(res Response) bool {
		b, err := json.Marshal(res)
		if err != nil {
			b, _ = json.Marshal(Response{Error: errorf(CodeFailed, "encode the answer: %v", err)})
		}
		_, err = w.Write(append(b, '\n'))
		return err == nil && w.Flush() == nil
	}
	cred, err := peer(conn)
	if err != nil {
		s.cfg.Logger.Warn("bcd helper: cannot read a caller's credentials; refused", "error", err)
		answer(Response{Error: errorf(CodeNotAllowed, "the caller's credentials cannot be read")})
		return
	}
	if int(cred.Uid) != s.cfg.AllowUID {
		s.cfg.Logger.Warn("bcd helper: refused a caller of another uid", "uid", cred.Uid, "pid", cred.Pid, "allowed", s.cfg.AllowUID)
		answer(Response{Error: errorf(CodeNotAllowed, "uid %d may not use this helper: it serves uid %d (--allow-uid)", cred.Uid, s.cfg.AllowUID)})
		return
	}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLine)
	for sc.Scan() {
		res := s.handle(ctx, sc.Bytes())
		if res.Error != nil {
			s.cfg.Logger.Warn("bcd helper: refused or failed", "pid", cred.Pid, "code", res.Error.Code, "error", res.Error.Message)
		}
		if !answer(res) {
			return
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, net.ErrClosed) {
		answer(Response{Error: errorf(CodeInvalidArgument, "the request is not a line of JSON of at most %d bytes: %v", MaxLine, err)})
	}
}

// handle answers one request line.
func (s *Server) handle(ctx context.Context, line []byte) Response {
	var req Request
	if err := decodeStrict(line, &req); err != nil {
		return Response{Error: errorf(CodeInvalidArgument, "the request is not {\"op\", \"args\"}: %v", err)}
	}
	cmd, ok := commands[req.Op]
	if !ok {
		return Response{Error: errorf(CodeUnknownCommand, "%q is not a command of this helper; it does %v", req.Op, Ops)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out, err := cmd(ctx, s, req.Args)
	if err != nil {
		var he *Error
		if !errors.As(err, &he) {
			he = errorf(codeOf(err), "%s: %v", req.Op, err)
		}
		return Response{Error: he}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return Response{Error: errorf(CodeFailed, "encode the answer: %v", err)}
	}
	return Response{Result: b}
}

// decodeStrict decodes one JSON value, refusing unknown fields and trailing data.
func decodeStrict(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		b = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the JSON value")
	}
	return nil
}

// command is one entry of the fixed table.
type command func(ctx context.Context, s *Server, args json.RawMessage) (any, error)

// checked is a command whose arguments decode strictly into A and pass A's check.
func checked[A interface{ check() error }](run func(ctx context.Context, s *Server, a A) (any, error)) command {
	return func(ctx context.Context, s *Server, raw json.RawMessage) (any, error) {
		var a A
		if err := decodeStrict(raw, &a); err != nil {
			return nil, errorf(CodeInvalidArgument, "the arguments: %v", err)
		}
		if err := a.check(); err != nil {
			return nil, err
		}
		return run(ctx, s, a)
	}
}

var commands = map[string]command{
	OpHello: hello,
	OpCDIWrite: checked(func(_ context.Context, s *Server, a CDIWrite) (any, error) {
		if err := s.cfg.Policy.Check(a.Holder, a.Spec); err != nil {
			return nil, errorf(CodeNotAllowed, "%v", err)
		}
		root, err := s.root(a.Dir)
		if err != nil {
			return nil, err
		}
		defer root.Close()
		return struct{}{}, writeIn(root, cdi.SpecName(a.Holder), a.Spec)
	}),
	OpCDIRemove: checked(func(_ context.Context, s *Server, a CDIRef) (any, error) {
		root, err := s.root(a.Dir)
		if err != nil {
			return nil, err
		}
		defer root.Close()
		if err := root.Remove(a.Name); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return struct{}{}, nil
	}),
	OpCDIList: checked(func(_ context.Context, s *Server, a CDIList) (any, error) {
		if _, err := s.root(a.Dir); err != nil {
			return nil, err
		}
		names, err := cdi.DirSpecs(filepath.Clean(a.Dir)).List()
		return CDINames{Names: names}, err
	}),
	OpMIGState: checked(func(_ context.Context, s *Server, a GPU) (any, error) {
		m, err := s.mig()
		if err != nil {
			return nil, err
		}
		return m.MIGState(a.GPU)
	}),
	OpMIGSetMode: checked(func(_ context.Context, s *Server, a MIGMode) (any, error) {
		m, err := s.mig()
		if err != nil {
			return nil, err
		}
		s.cfg.Logger.Info("bcd helper: MIG mode", "gpu", a.GPU, "enabled", a.Enabled)
		return struct{}{}, m.SetMIGMode(a.GPU, a.Enabled)
	}),
	OpMIGCreate: checked(func(_ context.Context, s *Server, a MIGCreate) (any, error) {
		m, err := s.mig()
		if err != nil {
			return nil, err
		}
		s.cfg.Logger.Info("bcd helper: MIG instance made", "gpu", a.GPU, "profile", a.Profile, "start", a.Start)
		return m.CreateMIGInstance(a.GPU, a.Profile, a.Start)
	}),
	OpMIGDestroy: checked(func(_ context.Context, s *Server, a MIGDestroy) (any, error) {
		m, err := s.mig()
		if err != nil {
			return nil, err
		}
		s.cfg.Logger.Info("bcd helper: MIG instance destroyed", "gpu", a.GPU, "gi", a.GI)
		return struct{}{}, m.DestroyMIGInstance(a.GPU, a.GI)
	}),
	OpGPUReset: checked(func(ctx context.Context, s *Server, a GPU) (any, error) {
		if s.cfg.Reset == nil {
			return nil, errorf(CodeUnavailable, "this helper cannot reset GPUs: %s", s.cfg.Why)
		}
		s.cfg.Logger.Info("bcd helper: GPU reset", "gpu", a.GPU)
		return struct{}{}, s.cfg.Reset(ctx, a.GPU)
	}),
}

// hello says what this helper serves.
func hello(_ context.Context, s *Server, raw json.RawMessage) (any, error) {
	var none struct{}
	if err := decodeStrict(raw, &none); err != nil {
		return nil, errorf(CodeInvalidArgument, "hello takes no arguments: %v", err)
	}
	return HelloResult{Version: ProtocolVersion, Ops: Ops, CDIRoots: s.cfg.CDIRoots, MIG: s.cfg.MIG != nil, Reset: s.cfg.Reset != nil, Why: s.cfg.Why}, nil
}

// root opens dir, which must be one of the helper's spec directories. Files are then named
// within it (os.Root): a name cannot climb out of it, nor a symbolic link lead out.
func (s *Server) root(dir string) (*os.Root, error) {
	clean := filepath.Clean(dir)
	if !filepath.IsAbs(dir) || !slices.Contains(s.cfg.CDIRoots, clean) {
		return nil, errorf(CodeNotAllowed, "dir: %q is not a spec directory of this helper (%v)", dir, s.cfg.CDIRoots)
	}
	return os.OpenRoot(clean)
}

func (s *Server) mig() (hardware.MIG, error) {
	if s.cfg.MIG == nil {
		return nil, errorf(CodeUnavailable, "this helper has no MIG: %s", s.cfg.Why)
	}
	return s.cfg.MIG, nil
}

// writeIn replaces name in root with b, atomically (a temporary file renamed over it), unless it
// holds b already.
func writeIn(root *os.Root, name string, b []byte) error {
	if old, err := root.ReadFile(name); err == nil && bytes.Equal(old, b) {
		return nil
	}
	tmp := ".tmp-" + name
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		_ = root.Remove(tmp)
	}
	return err
}
