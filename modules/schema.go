package modules

import (
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
)

// schemaOptions maps types a JSON schema cannot infer well.
var schemaOptions = &jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
	reflect.TypeFor[json.RawMessage](): {Type: "object"},
	reflect.TypeFor[time.Time]():       {Type: "string", Format: "date-time"},
}}

// InputSchema is the JSON schema of a method's input type, as the method table serves it and
// the MCP tools offer it.
func InputSchema(in reflect.Type) (*jsonschema.Schema, error) {
	s, err := jsonschema.ForType(in, schemaOptions)
	if err != nil {
		return nil, fmt.Errorf("modules: the JSON schema of %s: %w", in, err)
	}
	return s, nil
}
