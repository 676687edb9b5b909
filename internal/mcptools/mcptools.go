// Package mcptools serves the Better Compute API to AI agents as MCP tools (the official Go SDK):
// one tool per method of the method table, with a JSON schema inferred from the method's Go input
// type, called through the typed client with the agent's own credential. Reads run directly; a
// mutation that the agent's delegation reserves for its person answers confirmation_required
// with a confirmation id until the person approves it, then runs once.
package mcptools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/modules"
)

// ToolName is the MCP tool of a method: group_method.
func ToolName(m api.MethodInfo) string { return m.Group + "_" + m.Name }

// schemas maps types a JSON schema cannot infer well.
var schemas = &jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
	reflect.TypeFor[json.RawMessage](): {Type: "object"},
	reflect.TypeFor[time.Time]():       {Type: "string", Format: "date-time"},
}}

// New returns an MCP server whose tools call the control plane through cl.
func New(cl *client.Client, version string) (*mcp.Server, error) {
	s := mcp.NewServer(&mcp.Implementation{Name: "better-compute", Version: version}, nil)
	for _, d := range api.Table() {
		info := d.Info()
		in, _ := d.Types()
		schema, err := jsonschema.ForType(in, schemas)
		if err != nil {
			return nil, fmt.Errorf("mcptools: schema of %s: %w", info.FullName(), err)
		}
		readOnly := !info.Mutating
		kind := "Changes state; an agent may need its person's confirmation."
		if readOnly {
			kind = "Reads only."
		}
		s.AddTool(&mcp.Tool{
			Name:        ToolName(info),
			Title:       info.FullName(),
			Description: fmt.Sprintf("%s %s IAM action %s.", info.Summary, kind, info.Action),
			InputSchema: schema,
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: readOnly},
		}, handler(cl, info, in))
	}
	return s, nil
}

func handler(cl *client.Client, info api.MethodInfo, in reflect.Type) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		v, bad := DecodeArguments(in, req.Params.Arguments)
		if bad != nil {
			return failure(bad), nil
		}
		raw, err := cl.Do(ctx, info, v)
		if err != nil {
			var ae *api.Error
			if errors.As(err, &ae) {
				return failure(ae), nil
			}
			return failure(&api.Error{Code: api.CodeUnavailable, Message: err.Error()}), nil
		}
		var structured any
		_ = json.Unmarshal(raw, &structured)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(raw)}}, StructuredContent: structured}, nil
	}
}

// DecodeArguments makes a method's input (of type in) from a tool call's arguments, as strictly as
// the API decodes a body: an unknown field, a wrong type or trailing data is invalid_argument
// naming what was wrong, never silently dropped. No arguments (or null) is an empty input.
func DecodeArguments(in reflect.Type, args json.RawMessage) (any, *api.Error) {
	v := reflect.New(in)
	if len(args) > 0 && string(args) != "null" {
		if err := modules.DecodeJSON(args, v.Interface()); err != nil {
			var ae *api.Error
			if !errors.As(err, &ae) {
				ae = &api.Error{Code: api.CodeInvalidArgument, Message: err.Error()}
			}
			return nil, &api.Error{Code: ae.Code, Message: "arguments: " + ae.Message, Details: ae.Details}
		}
	}
	return v.Elem().Interface(), nil
}

// failure is a tool error the agent can read: the code, what to do, and the details (a
// confirmation's id among them).
func failure(e *api.Error) *mcp.CallToolResult {
	text := string(e.Code) + ": " + e.Message
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}},
		StructuredContent: map[string]any{"error": e}}
}
