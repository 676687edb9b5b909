package helper

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/bcd/internal/hardware"
)

// Timeouts of a call: a GPU reset takes its time.
const (
	CallTimeout  = 30 * time.Second
	ResetTimeout = 3 * time.Minute
)

// Client calls a helper over its socket: one connection, one call at a time, dialled again
// when it breaks.
type Client struct {
	path string
	// NoMIG is set when the helper has no MIG: MIG returns nil then.
	NoMIG bool

	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
}

// NewClient returns a client of the helper at path; it connects on its first call.
func NewClient(path string) *Client { return &Client{path: path} }

// Dial connects to the helper at path and asks what it serves; a helper that refuses this
// process (its uid) answers here.
func Dial(path string) (*Client, HelloResult, error) {
	c := NewClient(path)
	var h HelloResult
	if err := c.Call(context.Background(), OpHello, nil, &h); err != nil {
		return nil, h, err
	}
	if h.Version != ProtocolVersion {
		return nil, h, fmt.Errorf("bcd helper at %s speaks version %d of the helper protocol, this bcd %d: run the same bcd as both", path, h.Version, ProtocolVersion)
	}
	return c, h, nil
}

// Close closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// Call sends one command with args and decodes its result into out (nil: ignored). A refusal or
// a failure is an *Error.
func (c *Client) Call(ctx context.Context, op string, args, out any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	req := Request{Op: op}
	if args != nil {
		b, err := json.Marshal(args)
		if err != nil {
			return err
		}
		req.Args = b
	}
	line, err := json.Marshal(req)
	if err != nil {
		return err
	}
	timeout := CallTimeout
	if op == OpGPUReset {
		timeout = ResetTimeout
	}
	var res Response
	for attempt := 0; ; attempt++ {
		res, err = c.roundTrip(ctx, append(line, '\n'), timeout)
		if err == nil {
			break
		}
		c.drop()
		// A connection the helper closed (it restarted) is dialled again, once; a call is not
		// sent twice once it may have been read.
		if attempt > 0 || !errors.Is(err, errStale) {
			return fmt.Errorf("bcd helper at %s: %s: %w", c.path, op, err)
		}
	}
	if res.Error != nil {
		return res.Error
	}
	if out != nil && len(res.Result) > 0 {
		return json.Unmarshal(res.Result, out)
	}
	return nil
}

// errStale is a write to a connection the helper had closed.
var errStale = errors.New("the connection was closed")

func (c *Client) roundTrip(ctx context.Context, line []byte, timeout time.Duration) (Response, error) {
	var res Response
	fresh := c.conn == nil
	if fresh {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", c.path)
		if err != nil {
			return res, err
		}
		c.conn, c.r = conn, bufio.NewReaderSize(conn, 64<<10)
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.conn.SetDeadline(deadline)
	if _, werr := c.conn.Write(line); werr != nil {
		if !fresh {
			return res, fmt.Errorf("%w: %v", errStale, werr)
		}
		// A helper that refuses this process answers before it reads, and closes: its
		// answer may still be there to read.
		if b, err := c.r.ReadSlice('\n'); err == nil && json.Unmarshal(b, &res) == nil && res.Error != nil {
			return res, nil
		}
		return res, werr
	}
	b, err := c.r.ReadSlice('\n')
	if err != nil {
		if !fresh && len(b) == 0 {
			return res, fmt.Errorf("%w: %v", errStale, err)
		}
		return res, err
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return res, fmt.Errorf("the answer is not JSON: %w", err)
	}
	return res, nil
}

func (c *Client) drop() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// Specs is a spec directory of the helper, for cdi.Converger.Specs.
func (c *Client) Specs(dir string) cdi.Specs { return specDir{c: c, dir: dir} }

type specDir struct {
	c   *Client
	dir string
}

func (s specDir) Write(name string, b []byte) error {
	holder, ok := cdi.HolderOf(name)
	if !ok {
		return fmt.Errorf("bcd helper: %q is not a spec file name", name)
	}
	return s.c.Call(context.Background(), OpCDIWrite, CDIWrite{Dir: s.dir, Holder: holder, Spec: b}, nil)
}

func (s specDir) Remove(name string) error {
	return s.c.Call(context.Background(), OpCDIRemove, CDIRef{Dir: s.dir, Name: name}, nil)
}

func (s specDir) List() ([]string, error) {
	var out CDINames
	err := s.c.Call(context.Background(), OpCDIList, CDIList{Dir: s.dir}, &out)
	return out.Names, err
}

var _ hardware.MIG = (*Client)(nil)

// MIG is the helper's MIG, nil when it has none.
func (c *Client) MIG() hardware.MIG {
	if c.NoMIG {
		return nil
	}
	return c
}

// MIGState implements hardware.MIG through the helper.
func (c *Client) MIGState(gpu int) (hardware.MIGState, error) {
	var st hardware.MIGState
	err := c.Call(context.Background(), OpMIGState, GPU{GPU: gpu}, &st)
	return st, err
}

// SetMIGMode implements hardware.MIG through the helper.
func (c *Client) SetMIGMode(gpu int, enabled bool) error {
	return c.Call(context.Background(), OpMIGSetMode, MIGMode{GPU: gpu, Enabled: enabled}, nil)
}

// CreateMIGInstance implements hardware.MIG through the helper.
func (c *Client) CreateMIGInstance(gpu int, profile string, start int) (hardware.MIGInstance, error) {
	var in hardware.MIGInstance
	err := c.Call(context.Background(), OpMIGCreate, MIGCreate{GPU: gpu, Profile: profile, Start: start}, &in)
	return in, err
}

// DestroyMIGInstance implements hardware.MIG through the helper.
func (c *Client) DestroyMIGInstance(gpu, gi int) error {
	return c.Call(context.Background(), OpMIGDestroy, MIGDestroy{GPU: gpu, GI: gi}, nil)
}

// ResetGPU resets a GPU through the helper.
func (c *Client) ResetGPU(ctx context.Context, gpu int) error {
	return c.Call(ctx, OpGPUReset, GPU{GPU: gpu}, nil)
}
