package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The Kubernetes manifests (deploy/k8s, docs/kubernetes.md) are checked
// here, not applied to a cluster: every document is decoded strictly into
// k8s.io/api's types (unknown, duplicate and wrongly cased fields are
// errors, as a kube-apiserver's strict field validation makes them), and
// the objects are held to the invariants a cluster would only reveal at
// run time: selectors against labels, Services against ports, references
// against the Secrets and ConfigMaps of the set, and every phalanx
// container's arguments parsed by the command's own flags, for every
// replica, with the downward API's values in place of $(POD_NAME) and
// $(POD_IP).

// k8sDir holds the manifests, from this package's directory.
const k8sDir = "../../deploy/k8s"

// phalanxBinary is where both images of the Dockerfile put the binary.
const phalanxBinary = "/usr/local/bin/phalanx"

// k8sObject is one decoded document.
type k8sObject struct {
	file       string // relative to the set's directory
	kind, name string
	meta       *metav1.ObjectMeta
	obj        any // *appsv1.StatefulSet, *corev1.Service, ...
}

func (o k8sObject) String() string { return fmt.Sprintf("%s: %s/%s", o.file, o.kind, o.name) }

// kustomization is the part of a kustomization.yaml the manifests use,
// and the images `kustomize edit set image` writes (docs/kubernetes.md).
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// k8sSet is a directory tree of manifests.
type k8sSet struct {
	objects        []k8sObject
	kustomizations map[string]kustomization // by directory, relative ("." the top)
	yamlFiles      map[string][]string      // each directory's manifests, kustomization.yaml aside
}

// k8sKinds makes the typed object of each kind the manifests may hold.
var k8sKinds = map[string]func() any{
	"v1/Namespace":                  func() any { return &corev1.Namespace{} },
	"v1/ConfigMap":                  func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                     func() any { return &corev1.Secret{} },
	"v1/Service":                    func() any { return &corev1.Service{} },
	"v1/PersistentVolumeClaim":      func() any { return &corev1.PersistentVolumeClaim{} },
	"apps/v1/StatefulSet":           func() any { return &appsv1.StatefulSet{} },
	"apps/v1/Deployment":            func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget": func() any { return &policyv1.PodDisruptionBudget{} },
}

// decodeStrict decodes one YAML document into v as a kube-apiserver's
// strict field validation would: duplicate keys, unknown fields and
// fields of the wrong case are errors.
func decodeStrict(doc []byte, v any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(js, v)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("strict decoding: %s", strings.Join(msgs, "; "))
	}
	return nil
}

// loadK8s reads every .yaml file under dir, each document strictly
// decoded into its kind's type.
func loadK8s(dir string) (*k8sSet, error) {
	s := &k8sSet{kustomizations: map[string]kustomization{}, yamlFiles: map[string][]string{}}
	seen := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (filepath.Ext(p) != ".yaml" && filepath.Ext(p) != ".yml") {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rdir := filepath.Dir(rel)
		if filepath.Base(rel) == "kustomization.yaml" {
			var k kustomization
			if err := decodeStrict(data, &k); err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			s.kustomizations[rdir] = k
			return nil
		}
		s.yamlFiles[rdir] = append(s.yamlFiles[rdir], filepath.Base(rel))
		for i, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(data), -1) {
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				return fmt.Errorf("%s, document %d: %w", rel, i+1, err)
			}
			if tm.Kind == "" && tm.APIVersion == "" && strings.TrimSpace(stripComments(doc)) == "" {
				continue // comments alone
			}
			mk, ok := k8sKinds[tm.APIVersion+"/"+tm.Kind]
			if !ok {
				return fmt.Errorf("%s, document %d: kind %q of apiVersion %q is not one of %v", rel, i+1, tm.Kind, tm.APIVersion, slices.Sorted(maps.Keys(k8sKinds)))
			}
			obj := mk()
			if err := decodeStrict([]byte(doc), obj); err != nil {
				return fmt.Errorf("%s, document %d (%s): %w", rel, i+1, tm.Kind, err)
			}
			meta := objectMeta(obj)
			o := k8sObject{file: rel, kind: tm.Kind, name: meta.Name, meta: meta, obj: obj}
			key := tm.Kind + "/" + meta.Namespace + "/" + meta.Name
			if prev, dup := seen[key]; dup {
				return fmt.Errorf("%s: %s/%s is defined twice (also in %s)", rel, tm.Kind, meta.Name, prev)
			}
			seen[key] = rel
			s.objects = append(s.objects, o)
		}
		return nil
	})
	return s, err
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// objectMeta is the metadata every typed object embeds.
func objectMeta(obj any) *metav1.ObjectMeta {
	return obj.(metav1.ObjectMetaAccessor).GetObjectMeta().(*metav1.ObjectMeta)
}

// TestK8sManifests checks deploy/k8s as it is: every problem is an error.
func TestK8sManifests(t *testing.T) {
	s, err := loadK8s(k8sDir)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, o := range s.objects {
		kinds[o.kind]++
	}
	t.Logf("%d objects: %v", len(s.objects), kinds)
	for _, want := range []string{"Namespace", "ConfigMap", "StatefulSet", "Deployment", "Service", "PodDisruptionBudget", "PersistentVolumeClaim", "Secret"} {
		if kinds[want] == 0 {
			t.Errorf("no %s in %s", want, k8sDir)
		}
	}
	for _, p := range checkK8s(s, startProbeServer(t)) {
		t.Error(p)
	}
}

// TestK8sManifestMutations breaks the manifests one field at a time, in a
// copy, and requires each break to be reported: every check is seen to
// fail.
func TestK8sManifestMutations(t *testing.T) {
	probe := startProbeServer(t)
	const (
		workerSTS = "worker-statefulset.yaml"
		etcdSTS   = "etcd-statefulset.yaml"
		coordDep  = "coordinator-deployment.yaml"
		psSTS     = "parameter-servers/ps-statefulset.yaml"
		config    = "configmap.yaml"
	)
	workerTemplateLabels := "    metadata:\n      labels:\n        app.kubernetes.io/name: phalanx\n        app.kubernetes.io/component: worker\n    spec:"
	for _, m := range []struct {
		name     string
		file     string
		old, new string // old "" creates file with new
		remove   bool   // remove file
		want     string // in a problem or the load's error
	}{
		// Strict decoding.
		{name: "unknown field", file: workerSTS, old: "podManagementPolicy: Parallel", new: "podManagmentPolicy: Parallel", want: `unknown field "spec.podManagmentPolicy"`},
		{name: "field of the wrong case", file: workerSTS, old: "serviceName: phalanx-worker", new: "ServiceName: phalanx-worker", want: `unknown field "spec.ServiceName"`},
		{name: "duplicate key", file: workerSTS, old: "  replicas: 4\n", new: "  replicas: 4\n  replicas: 5\n", want: "already set in map"},
		{name: "unknown kind", file: "worker-pdb.yaml", old: "kind: PodDisruptionBudget", new: "kind: PodDisruptionBudgets", want: `kind "PodDisruptionBudgets"`},
		{name: "wrong type", file: workerSTS, old: "  replicas: 4\n", new: "  replicas: four\n", want: "cannot unmarshal string"},
		{name: "object defined twice", file: "configmap-copy.yaml", new: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: phalanx-job\n  namespace: phalanx\n", want: "defined twice"},
		// The kustomization and the namespace.
		{name: "a manifest left out of kustomization.yaml", file: "kustomization.yaml", old: "  - worker-pdb.yaml\n", new: "", want: "worker-pdb.yaml is not in its directory's kustomization.yaml"},
		{name: "kustomization.yaml lists a missing file", file: "kustomization.yaml", old: "  - worker-pdb.yaml\n", new: "  - worker-pdb.yaml\n  - missing.yaml\n", want: "lists missing.yaml"},
		{name: "object in another namespace", file: "minio-pvc.yaml", old: "namespace: phalanx", new: "namespace: default", want: `namespace "default"`},
		{name: "kustomization in another namespace", file: "parameter-servers/kustomization.yaml", old: "namespace: phalanx", new: "namespace: ps", want: `namespace "ps"`},
		{name: "object without the name label", file: "minio-service.yaml", old: "    app.kubernetes.io/name: phalanx\n    app.kubernetes.io/component: minio\nspec:", new: "    app.kubernetes.io/name: minio\n    app.kubernetes.io/component: minio\nspec:", want: "want app.kubernetes.io/name=phalanx"},
		{name: "kustomization of another kind", file: "kustomization.yaml", old: "kind: Kustomization", new: "kind: Component", want: `kind "Component", want`},
		{name: "no Namespace", file: "namespace.yaml", remove: true, want: "want one Namespace in the set"},
		{name: "pods of another component", file: workerSTS, old: "    app.kubernetes.io/component: worker\nspec:", new: "    app.kubernetes.io/component: workers\nspec:", want: `its pods' component "worker" is not its own "workers"`},
		// Selectors.
		{name: "selector does not select the template", file: workerSTS, old: workerTemplateLabels, new: strings.Replace(workerTemplateLabels, "component: worker", "component: trainer", 1), want: "does not select its pod template's labels"},
		{name: "Service selects no pods", file: "etcd-service.yaml", old: "  selector:\n    app.kubernetes.io/name: phalanx\n    app.kubernetes.io/component: etcd", new: "  selector:\n    app.kubernetes.io/name: phalanx\n    app.kubernetes.io/component: etcd-member", want: "selects the pods of 0 workloads"},
		{name: "Service selects every workload", file: "worker-service.yaml", old: "  selector:\n    app.kubernetes.io/name: phalanx\n    app.kubernetes.io/component: worker\n", new: "  selector:\n    app.kubernetes.io/name: phalanx\n", want: "selects the pods of 5 workloads"},
		{name: "PDB selects no pods", file: "worker-pdb.yaml", old: "      app.kubernetes.io/component: worker", new: "      app.kubernetes.io/component: workers", want: "selects the pods of 0 workloads"},
		{name: "anti-affinity selects other pods", file: coordDep, old: "                    app.kubernetes.io/component: coordinator", new: "                    app.kubernetes.io/component: etcd", want: "its pod anti-affinity selects"},
		{name: "spread constraint selects other pods", file: workerSTS, old: "              app.kubernetes.io/component: worker", new: "              app.kubernetes.io/component: ps", want: "its topology spread constraint selects"},
		// Services and StatefulSets.
		{name: "Service targets an undeclared port", file: "worker-service.yaml", old: "targetPort: metrics", new: "targetPort: prometheus", want: "targets prometheus"},
		{name: "serviceName names no Service", file: workerSTS, old: "serviceName: phalanx-worker", new: "serviceName: phalanx-workers", want: `serviceName "phalanx-workers" names no Service`},
		{name: "serviceName names a Service that is not headless", file: "etcd-service.yaml", old: "  clusterIP: None\n", new: "", want: "not headless"},
		{name: "ordered pod management", file: workerSTS, old: "podManagementPolicy: Parallel", new: "podManagementPolicy: OrderedReady", want: "want Parallel"},
		// References.
		{name: "ConfigMap key missing", file: coordDep, old: "key: MAX_WORKERS", new: "key: MAXWORKERS", want: "key MAXWORKERS of ConfigMap phalanx-job"},
		{name: "ConfigMap missing", file: workerSTS, old: "name: phalanx-job\n                  key: CHECKPOINT", new: "name: phalanx-config\n                  key: CHECKPOINT", want: "ConfigMap phalanx-config, which is not in the set"},
		{name: "Secret missing", file: "secrets/phalanx-s3.yaml", remove: true, want: "Secret phalanx-s3, which is not in the set"},
		{name: "Secret key missing", file: "secrets/phalanx-s3.yaml", old: "  AWS_SECRET_ACCESS_KEY: \"\"\n", new: "", want: "key AWS_SECRET_ACCESS_KEY of Secret phalanx-s3"},
		{name: "claim missing", file: "minio-deployment.yaml", old: "claimName: phalanx-minio", new: "claimName: minio-data", want: "claims minio-data"},
		{name: "envFrom a missing ConfigMap", file: coordDep, old: "          env:\n", new: "          envFrom:\n            - configMapRef:\n                name: phalanx-settings\n          env:\n", want: "envFrom ConfigMap phalanx-settings"},
		{name: "Secret volume of a missing key", file: coordDep, old: "            secretName: phalanx-tls\n", new: "            secretName: phalanx-tls\n            items:\n              - key: ca.pem\n                path: ca.crt\n", want: "mounts key ca.pem of Secret phalanx-tls"},
		{name: "ConfigMap volume of a missing ConfigMap", file: coordDep, old: "      volumes:\n", new: "      volumes:\n        - name: settings\n          configMap:\n            name: phalanx-settings\n", want: "mounts ConfigMap phalanx-settings"},
		{name: "mount of an undeclared volume", file: coordDep, old: "        - name: tls\n          secret:", new: "        - name: certs\n          secret:", want: "mounts volume tls, which the pod does not declare"},
		{name: "volume mounted by no container", file: workerSTS, old: "            - name: tmp\n              mountPath: /tmp\n", new: "", want: "volume tmp is mounted by no container"},
		// Command lines.
		{name: "command elsewhere", file: workerSTS, old: `command: ["/usr/local/bin/phalanx"]`, new: `command: ["/phalanx"]`, want: "where the Dockerfile puts it"},
		{name: "unknown command", file: coordDep, old: "            - coordinator\n", new: "            - coordinate\n", want: `runs phalanx ["coordinate"`},
		{name: "unknown flag", file: workerSTS, old: "--checkpoint-every-steps=500", new: "--checkpoint-every-step=500", want: "unknown flag --checkpoint-every-step"},
		{name: "flag value that does not parse", file: workerSTS, old: "--steps=100000", new: "--steps=many", want: `--steps "many": want a whole number`},
		{name: "positional argument", file: psSTS, old: "            - --log-level=info\n", new: "            - info\n", want: `unexpected argument "info"`},
		{name: "undefined variable", file: workerSTS, old: "--advertise=$(POD_IP)", new: "--advertise=$(POD_ADDR)", want: "names $(POD_ADDR)"},
		{name: "variable's definition removed", file: etcdSTS, old: "            - name: POD_IP\n              valueFrom:\n                fieldRef:\n                  fieldPath: status.podIP\n", new: "", want: "names $(POD_IP)"},
		{name: "Secret on the command line", file: workerSTS, old: "            - --log-level=info\n", new: "            - --log-level=info\n            - --s3-secret-key=$(AWS_SECRET_ACCESS_KEY)\n", want: "puts Secret-backed $(AWS_SECRET_ACCESS_KEY) on the command line"},
		{name: "launcher's worker variable", file: coordDep, old: "          env:\n", new: "          env:\n            - name: PHALANX_WORKER\n              value: \"{}\"\n", want: "env PHALANX_WORKER makes the process a launcher's worker"},
		{name: "PHALANX_ variable naming no flag", file: workerSTS, old: "          env:\n", new: "          env:\n            - name: PHALANX_STEPZ\n              value: \"10\"\n", want: "env PHALANX_STEPZ names no flag"},
		{name: "PHALANX_ variable that does not parse", file: workerSTS, old: "          env:\n", new: "          env:\n            - name: PHALANX_LOG_EVERY\n              value: often\n", want: "env PHALANX_LOG_EVERY="},
		// Ports and addresses.
		{name: "--bind port undeclared", file: workerSTS, old: "--bind=0.0.0.0:7011", new: "--bind=0.0.0.0:7012", want: "port 7012 is not a declared containerPort"},
		{name: "--bind on loopback", file: workerSTS, old: "--bind=0.0.0.0:7011", new: "--bind=127.0.0.1:7011", want: "other pods cannot reach that host"},
		{name: "--bind on port 0", file: workerSTS, old: "--bind=0.0.0.0:7011", new: "--bind=0.0.0.0:0", want: "no fixed port"},
		{name: "--metrics port undeclared", file: workerSTS, old: "--metrics=0.0.0.0:9400", new: "--metrics=0.0.0.0:9401", want: "port 9401 is not a declared containerPort"},
		{name: "--listen port undeclared", file: psSTS, old: "--listen=0.0.0.0:7100", new: "--listen=0.0.0.0:7101", want: "port 7101 is not a declared containerPort"},
		{name: "--client-port undeclared", file: etcdSTS, old: "--client-port=2379", new: "--client-port=2377", want: "port 2377 is not a declared containerPort"},
		{name: "--advertise missing", file: psSTS, old: "            - --advertise=$(POD_IP)\n", new: "", want: "--advertise must be the pod's IP"},
		{name: "--advertise not the pod's IP", file: workerSTS, old: "--advertise=$(POD_IP)", new: "--advertise=10.0.0.1", want: "--advertise must be the pod's IP"},
		{name: "--id shared by the replicas", file: psSTS, old: "--id=$(POD_NAME)", new: "--id=ps", want: `--id "ps", want the pod's name`},
		{name: "--listen without a host", file: psSTS, old: "--listen=0.0.0.0:7100", new: "--listen=7100", want: "missing port in address"},
		{name: "S3 key on the command line", file: workerSTS, old: "            - --log-level=info\n", new: "            - --log-level=info\n            - --s3-access-key=phalanx\n", want: "--s3-access-key on the command line"},
		{name: "env of an unknown field", file: workerSTS, old: "fieldPath: status.podIP", new: "fieldPath: spec.nodeName", want: "reads field spec.nodeName"},
		// Probes.
		{name: "probe path not served", file: workerSTS, old: "path: /readyz", new: "path: /ready", want: "path /ready is not served"},
		{name: "readiness probe on /healthz", file: workerSTS, old: "path: /readyz", new: "path: /healthz", want: "does not tell readiness"},
		{name: "liveness probe on /readyz", file: workerSTS, old: "          livenessProbe:\n            httpGet:\n              path: /healthz", new: "          livenessProbe:\n            httpGet:\n              path: /readyz", want: "the liveness probe's path /readyz answers 503"},
		{name: "probe on another port", file: workerSTS, old: "              path: /readyz\n              port: metrics", new: "              path: /readyz\n              port: data", want: "is not the --metrics port 9400"},
		{name: "no readiness probe", file: workerSTS, old: "          readinessProbe:\n            httpGet:\n              path: /readyz\n              port: metrics\n            periodSeconds: 5\n            failureThreshold: 2\n", new: "", want: "no readiness probe"},
		{name: "probe without --metrics", file: coordDep, old: "          resources:\n", new: "          livenessProbe:\n            tcpSocket:\n              port: 9400\n          resources:\n", want: "a liveness probe, and no --metrics"},
		{name: "liveness probe over TCP", file: workerSTS, old: "          livenessProbe:\n            httpGet:\n              path: /healthz\n              port: metrics", new: "          livenessProbe:\n            tcpSocket:\n              port: metrics", want: "the liveness probe is not an HTTP GET"},
		// TLS.
		{name: "TLS file outside its Secret volume", file: workerSTS, old: "--tls-key=/etc/phalanx/tls/tls.key", new: "--tls-key=/etc/phalanx/tls.key", want: "--tls-key /etc/phalanx/tls.key: no Secret volume is mounted there"},
		{name: "TLS file of no Secret key", file: workerSTS, old: "--tls-key=/etc/phalanx/tls/tls.key", new: "--tls-key=/etc/phalanx/tls/key.pem", want: `has no key "key.pem"`},
		{name: "a member's own key missing", file: "secrets/phalanx-etcd-tls.yaml", old: "  phalanx-etcd-2.key: \"\"\n", new: "", want: `has no key "phalanx-etcd-2.key"`},
		{name: "two TLS flags of three", file: coordDep, old: "            - --tls-key=/etc/phalanx/tls/tls.key\n", new: "", want: "--tls-key is missing"},
		{name: "one process without TLS", file: psSTS, old: "            - --tls-ca=/etc/phalanx/tls/ca.crt\n            - --tls-cert=/etc/phalanx/tls/tls.crt\n            - --tls-key=/etc/phalanx/tls/tls.key\n", new: "", want: "and not in [phalanx-ps]"},
		{name: "TLS file in a volume that is not a Secret", file: workerSTS, old: "--tls-key=/etc/phalanx/tls/tls.key", new: "--tls-key=/tmp/tls.key", want: "volume tmp is not a Secret"},
		{name: "TLS Secret missing", file: "secrets/phalanx-tls.yaml", remove: true, want: "Secret phalanx-tls is not in the set"},
		// etcd.
		{name: "even number of etcd members", file: etcdSTS, old: "  replicas: 3\n", new: "  replicas: 4\n", want: "want an odd number"},
		{name: "--initial-cluster misses a member", file: etcdSTS, old: ",phalanx-etcd-2=https://phalanx-etcd-2.phalanx-etcd.phalanx.svc.cluster.local:2380", new: "", want: "want each replica"},
		{name: "--initial-cluster names another host", file: etcdSTS, old: "phalanx-etcd-1=https://phalanx-etcd-1.phalanx-etcd.", new: "phalanx-etcd-1=https://phalanx-etcd-1.etcd.", want: "want the pod phalanx-etcd-1's DNS name"},
		{name: "--initial-cluster in plaintext under TLS", file: etcdSTS, old: "phalanx-etcd-0=https://", new: "phalanx-etcd-0=http://", want: `--initial-cluster entry "phalanx-etcd-0=http://phalanx-etcd-0.phalanx-etcd.phalanx.svc.cluster.local:2380": want https://`},
		{name: "--initial-cluster on another port", file: etcdSTS, old: "svc.cluster.local:2380,phalanx-etcd-2", new: "svc.cluster.local:2381,phalanx-etcd-2", want: "want the peer port 2380"},
		{name: "--name not the pod's", file: etcdSTS, old: "--name=$(POD_NAME)", new: "--name=etcd", want: `--name "etcd"`},
		{name: "--host not the pod's IP", file: etcdSTS, old: "--host=$(POD_IP)", new: "--host=0.0.0.0", want: `--host "0.0.0.0"`},
		{name: "--dir not on a claim", file: etcdSTS, old: "--dir=/var/lib/phalanx/etcd", new: "--dir=/tmp/etcd", want: `--dir "/tmp/etcd" is not on a volume`},
		{name: "etcd addresses unpublished before readiness", file: "etcd-service.yaml", old: "  publishNotReadyAddresses: true\n", new: "", want: "publishNotReadyAddresses must be true"},
		// Membership.
		{name: "endpoints miss a member", file: config, old: ",https://phalanx-etcd-2.phalanx-etcd.phalanx.svc.cluster.local:2379", new: "", want: "leaves out the member phalanx-etcd-2"},
		{name: "endpoint on the peer port", file: config, old: "phalanx-etcd-0.phalanx-etcd.phalanx.svc.cluster.local:2379", new: "phalanx-etcd-0.phalanx-etcd.phalanx.svc.cluster.local:2380", want: "want the members' client port 2379"},
		{name: "endpoint in plaintext under TLS", file: config, old: "ETCD_ENDPOINTS: https://", new: "ETCD_ENDPOINTS: http://", want: `--etcd-endpoints "http://phalanx-etcd-0.phalanx-etcd.phalanx.svc.cluster.local:2379": want https://`},
		{name: "endpoint of no member", file: config, old: "https://phalanx-etcd-1.phalanx-etcd.phalanx", new: "https://etcd-1.phalanx-etcd.phalanx", want: "names no etcd member's DNS name"},
		{name: "another job", file: coordDep, old: "--job=$(JOB)", new: "--job=other", want: "different jobs"},
		{name: "--workers not the replicas", file: config, old: `WORKERS: "4"`, new: `WORKERS: "5"`, want: "want --workers = replicas"},
		{name: "--min-workers above --max-workers", file: config, old: `MIN_WORKERS: "2"`, new: `MIN_WORKERS: "9"`, want: "want 1 <= min <= max"},
		{name: "no standby coordinator", file: coordDep, old: "  replicas: 2\n", new: "  replicas: 1\n", want: "a standby to take over"},
		{name: "no --job", file: psSTS, old: "            - --job=$(JOB)\n", new: "", want: "no --job"},
		{name: "endpoint without a scheme", file: config, old: "ETCD_ENDPOINTS: https://", new: "ETCD_ENDPOINTS: ", want: "want scheme://host:port"},
		// Checkpoints.
		{name: "grace period shorter than the final checkpoint", file: workerSTS, old: "terminationGracePeriodSeconds: 180", new: "terminationGracePeriodSeconds: 60", want: "not longer than --checkpoint-wait"},
		{name: "no checkpoint store", file: workerSTS, old: "            - --checkpoint=$(CHECKPOINT)\n", new: "", want: "no --checkpoint"},
		{name: "S3 credentials missing", file: workerSTS, old: "            - name: AWS_SECRET_ACCESS_KEY\n              valueFrom:\n                secretKeyRef:\n                  name: phalanx-s3\n                  key: AWS_SECRET_ACCESS_KEY\n", new: "", want: "no AWS_SECRET_ACCESS_KEY from a Secret"},
		{name: "S3 endpoint of no Service", file: config, old: "endpoint=phalanx-minio.phalanx", new: "endpoint=minio.phalanx", want: "endpoint minio.phalanx.svc.cluster.local names no Service"},
		{name: "S3 endpoint on an unexposed port", file: config, old: "svc.cluster.local:9000", new: "svc.cluster.local:9001", want: "exposes no port 9001"},
		{name: "checkpoints in a pod's directory", file: config, old: "CHECKPOINT: s3://phalanx-checkpoints/demo?", new: "CHECKPOINT: /var/lib/phalanx/checkpoints?", want: "a pod's directory dies with it"},
		{name: "S3 endpoint without a port", file: config, old: "svc.cluster.local:9000&", new: "svc.cluster.local&", want: "endpoint=host:port"},
		// Disruption budgets.
		{name: "worker PDB below --min-workers", file: "worker-pdb.yaml", old: "maxUnavailable: 1", new: "maxUnavailable: 3", want: "below the coordinator's --min-workers 2"},
		{name: "etcd PDB below the quorum", file: "etcd-pdb.yaml", old: "maxUnavailable: 1", new: "maxUnavailable: 2", want: "below the quorum of 2"},
		{name: "PDB that blocks every drain", file: "coordinator-pdb.yaml", old: "maxUnavailable: 1", new: "maxUnavailable: 0", want: "a drain could never evict one"},
		{name: "worker PDB by minAvailable below --min-workers", file: "worker-pdb.yaml", old: "maxUnavailable: 1", new: "minAvailable: 1", want: "keeps 1 of 4 workers, below the coordinator's --min-workers 2"},
		{name: "PDB with both bounds", file: "etcd-pdb.yaml", old: "  maxUnavailable: 1\n", new: "  maxUnavailable: 1\n  minAvailable: 2\n", want: "want one of maxUnavailable and minAvailable"},
		{name: "no PDB for the workers", file: "worker-pdb.yaml", remove: true, want: "StatefulSet/phalanx-worker: no PodDisruptionBudget covers it"},
	} {
		t.Run(m.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.CopyFS(dir, os.DirFS(k8sDir)); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, filepath.FromSlash(m.file))
			switch {
			case m.remove: // and from its directory's kustomization.yaml, if it has one
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
				k := filepath.Join(filepath.Dir(p), "kustomization.yaml")
				if data, err := os.ReadFile(k); err == nil {
					if err := os.WriteFile(k, bytes.Replace(data, []byte("  - "+filepath.Base(p)+"\n"), nil, 1), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			case m.old == "":
				if err := os.WriteFile(p, []byte(m.new), 0o644); err != nil {
					t.Fatal(err)
				}
			default:
				data, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if n := strings.Count(string(data), m.old); n != 1 {
					t.Fatalf("the mutation's text occurs %d times in %s, want once: update the mutation", n, m.file)
				}
				if err := os.WriteFile(p, []byte(strings.Replace(string(data), m.old, m.new, 1)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			s, err := loadK8s(dir)
			var problems []string
			if err != nil {
				problems = []string{err.Error()}
			} else {
				problems = checkK8s(s, probe)
			}
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, m.want) }) {
				t.Errorf("not caught: want a problem with %q, have %d:\n%s", m.want, len(problems), strings.Join(problems, "\n"))
			}
		})
	}
}

// TestK8sImageEntrypoint holds the Dockerfile's two images to the
// manifests' command: each final stage runs phalanxBinary.
func TestK8sImageEntrypoint(t *testing.T) {
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := regexp.MustCompile(`(?m)^FROM\s+\S+\s+AS\s+(\S+)`).FindAllStringSubmatchIndex(string(data), -1)
	bodies := map[string]string{}
	for i, st := range stages {
		end := len(data)
		if i+1 < len(stages) {
			end = stages[i+1][0]
		}
		bodies[string(data[st[2]:st[3]])] = string(data[st[0]:end])
	}
	for _, target := range []string{"static", "openblas"} {
		body, ok := bodies[target]
		switch {
		case !ok:
			t.Errorf("the Dockerfile has no target %q", target)
		case !strings.Contains(body, fmt.Sprintf(`ENTRYPOINT ["%s"]`, phalanxBinary)):
			t.Errorf("the Dockerfile's target %s does not run %s, the manifests' command", target, phalanxBinary)
		}
	}
}
