module gpucoord

go 1.26.0

require (
	github.com/ebitengine/purego v0.11.3
	github.com/spf13/cobra v1.10.2
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.24.0
	gonum.org/v1/gonum v0.17.0
	gopkg.in/yaml.v3 v3.0.1
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/kr/text v0.2.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
)
