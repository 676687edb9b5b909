package main

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/internal/tools/mcptools"
)

func mcpCmd(p *profile) *cobra.Command {
	var httpAddr string
	c := &cobra.Command{
		Use:   "mcp",
		Short: "Serve the API to AI agents as MCP tools, over stdio or streamable HTTP",
		Long: `mcp serves one MCP tool per method of the API (pools_list, reservations_create, …), with JSON schemas of
their inputs, calling the control plane at --server.

Over stdio (the default) one agent uses it, with --api-key (that agent's key). With --http ADDR it
serves streamable HTTP to many agents, each with its own key: every request must send
Authorization: Bearer <key> (401 without one), that key is the credential of every call its session
makes, a session answers only the key that opened it, and --api-key is not used: the server lends no
rights of its own.

A mutation that the agent's delegation reserves for its person answers confirmation_required with a
confirmation id; once the person approves it, the same call runs once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if p.URL == "" {
				return usageError{Err: errors.New("mcp needs the control plane: --server or $BETTER_COMPUTE_URL")}
			}
			server := func(key string) (*mcp.Server, error) {
				cl, err := client.New(p.URL, client.WithAPIKey(key), client.WithUserAgent("better-compute-mcp/"+version))
				if err != nil {
					return nil, err
				}
				return mcptools.New(cmd.Context(), cl, version)
			}
			ctx, stop := signals()
			defer stop()
			if httpAddr == "" {
				s, err := server(p.APIKey)
				if err != nil {
					return err
				}
				return s.Run(ctx, &mcp.StdioTransport{})
			}
			// Over HTTP each agent brings its own key: the operator's --api-key is never used, so an
			// anonymous caller cannot borrow it.
			h := mcptools.HTTPHandler(func(key string) (*client.Client, error) {
				return client.New(p.URL, client.WithAPIKey(key), client.WithUserAgent("better-compute-mcp/"+version))
			}, version)
			// Requests are small JSON-RPC messages: their bodies are bounded and must arrive in
			// time. No write timeout: a session's answers stream for as long as it lasts.
			srv := &http.Server{Addr: httpAddr, Handler: http.MaxBytesHandler(h, mcpMaxBody),
				ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
			fmt.Fprintf(cmd.OutOrStdout(), "better-compute mcp: streamable HTTP on %s; every request needs Authorization: Bearer <API key>, the credential of its calls\n", httpAddr)
			errc := make(chan error, 1)
			go func() { errc <- srv.ListenAndServe() }()
			select {
			case <-ctx.Done():
				return srv.Close()
			case err := <-errc:
				return err
			}
		},
	}
	c.Flags().StringVar(&httpAddr, "http", "", "serve streamable HTTP on this address instead of stdio")
	return c
}

// mcpMaxBody bounds one MCP request over HTTP: a tool call's arguments are an API input, which the
// API bounds at 1 MiB, plus JSON-RPC's framing.
const mcpMaxBody = 2 << 20
