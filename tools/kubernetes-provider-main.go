// The pulumi-kubernetes provider's own main (provider/cmd/pulumi-resource-kubernetes/main.go) embeds generated files
// that the Go module does not carry; this one embeds the module's committed schema.json and terraform-mapping.json.
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed schema.json
var pulumiSchema []byte

//go:embed terraform-mapping.json
var terraformMapping []byte

func main() {
	provider.Serve("kubernetes", version.Version, pulumiSchema, terraformMapping)
}
