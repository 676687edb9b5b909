// Package mcptools serves the Better Compute API to AI agents as MCP tools (the official Go SDK):
// one tool per method the server serves (its method table, modules' methods included), with the
// JSON schema of the method's input, called through the client with the agent's own credential. Reads run directly; a
// mutation that the agent's delegation reserves for its person answers confirmation_required
// with a confirmation id until the person approves it, then runs once.
package mcptools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/modules"
)

// ToolName is the MCP tool of a method: group_method.
func ToolName(m api.MethodInfo) string { return m.Group + "_" + m.Name }

// New returns an MCP server whose tools call the control plane through cl: one per method the
// server's method table lists. The core's methods decode their arguments into their Go types
// here; a module's, unknown to this binary, go to the server as they are, which decodes them as
// strictly.
func New(ctx context.Context, cl *client.Client, version string) (*mcp.Server, error) {
	served, err := cl.Methods(ctx)
	if err != nil {
		return nil, fmt.Errorf("mcptools: read the server's method table: %w", err)
	}
	core := map[string]reflect.Type{}
	for _, d := range api.Table() {
		in, _ := d.Types()
		core[d.Info().FullName()] = in
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "better-compute", Version: version}, nil)
	for _, m := range served {
		info := m.MethodInfo
		schema := &jsonschema.Schema{}
		in, known := core[info.FullName()]
		if known {
			if schema, err = modules.InputSchema(in); err != nil {
				return nil, fmt.Errorf("mcptools: %w", err)
			}
		} else if err := json.Unmarshal(m.InputSchema, schema); err != nil || len(m.InputSchema) == 0 {
			return nil, fmt.Errorf("mcptools: the server's schema of %s is not a JSON schema: %v", info.FullName(), err)
		}
		readOnly := !info.Mutating
		kind := "Changes state; an agent may need its person's confirmation."
		if readOnly {
			kind = "Reads only."
		}
		h := handler(cl, info, in)
		if !known {
			h = passThrough(cl, info)
		}
		s.AddTool(&mcp.Tool{
			Name:        ToolName(info),
			Title:       info.FullName(),
			Description: fmt.Sprintf("%s %s IAM action %s.", info.Summary, kind, info.Action),
			InputSchema: schema,
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: readOnly},
		}, h)
	}
	return s, nil
}

// passThrough calls a method this binary has no Go types for: the arguments go to the server
// as they are (an object, or {} for none).
func passThrough(cl *client.Client, info api.MethodInfo) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := req.Params.Arguments
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage("{}")
		}
		return answer(cl.Do(ctx, info, args))
	}
}

func handler(cl *client.Client, info api.MethodInfo, in reflect.Type) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		v, bad := DecodeArguments(in, req.Params.Arguments)
		if bad != nil {
			return failure(bad), nil
		}
		return answer(cl.Do(ctx, info, v))
	}
}

// answer is a tool's result: the method's answer, or its error as the agent reads it.
func answer(raw json.RawMessage, err error) (*mcp.CallToolResult, error) {
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
