"""Checks infra/template.yaml as CloudFormation will deploy it: transformed by the SAM
translator that the pinned SAM CLI ships (offline, no AWS account), with the template's
default parameters.

  python sam-transformed-check.py TEMPLATE   (run with the SAM CLI venv's python)

What it holds, per function of the template:
- the deployed code is the zip `make build` wrote (../target/lambda/<binary>/bootstrap.zip,
  on provided.al2023, handler bootstrap, the Architecture parameter);
- a Function URL is public (AuthType NONE) and streams (InvokeMode RESPONSE_STREAM), and
  anyone may call it: lambda:InvokeFunctionUrl with FunctionUrlAuthType NONE *and*
  lambda:InvokeFunction restricted to calls through the URL (InvokedViaFunctionUrl) —
  since October 2025 a public Function URL answers 403 without the second;
- an SQS event source reports partial batch failures, a schedule has its rule and the
  permission for EventBridge to invoke;
- no function gets a role or a policy the translator made up (each has its own).
Prints one line per check group; exits 1 on the first failure list.
"""

import copy
import os
import sys

from samtranslator.model.exceptions import InvalidDocumentException
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


class NoManagedPolicies:
    def load(self):
        return {}


def main(path):
    # The translator's pseudo parameters need a region; no AWS call is made.
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with open(path, encoding="utf-8") as f:
        sam = yaml_parse(f.read())
    failures = []

    def check(ok, message):
        if not ok:
            failures.append(message)

    params = {k: v.get("Default") for k, v in sam.get("Parameters", {}).items()}
    params.update({"AWS::Region": "us-east-1", "AWS::AccountId": "123456789012", "AWS::Partition": "aws",
                   "AWS::StackName": "tollgate", "AWS::URLSuffix": "amazonaws.com"})
    functions = {k: r for k, r in sam["Resources"].items() if r["Type"] == "AWS::Serverless::Function"}
    check(functions, "the template has no AWS::Serverless::Function")

    # The code: a local zip per function, never a source directory `sam build` would build.
    for name, res in functions.items():
        uri = res["Properties"].get("CodeUri")
        check(isinstance(uri, str) and uri.startswith("../target/lambda/") and uri.endswith("/bootstrap.zip"),
              f"{name}: CodeUri {uri!r} is not a `make build` zip")
        check("Metadata" not in res or "BuildMethod" not in res["Metadata"],
              f"{name}: a BuildMethod makes `sam build` build other binaries than `make build`")

    offline = copy.deepcopy(sam)
    for res in offline["Resources"].values():
        if res["Type"] == "AWS::Serverless::Function":
            res["Properties"]["CodeUri"] = "s3://bucket/" + res["Properties"]["CodeUri"].lstrip("./")
    try:
        cfn = transform(offline, params, NoManagedPolicies())
    except InvalidDocumentException as e:
        print("sam-transformed-check: the SAM translator refuses the template:", file=sys.stderr)
        for cause in e.causes:
            print(f"  {cause.message}", file=sys.stderr)
        return 1
    res = cfn["Resources"]
    of_type = lambda t: {k: r for k, r in res.items() if r["Type"] == t}

    def targets(value, logical_id):
        return value in ({"Ref": logical_id}, {"Fn::GetAtt": [logical_id, "Arn"]})

    for name, fn in functions.items():
        lam = res.get(name, {})
        check(lam.get("Type") == "AWS::Lambda::Function", f"{name}: not an AWS::Lambda::Function")
        p = lam.get("Properties", {})
        code = p.get("Code", {})
        check(code.get("S3Key") == fn["Properties"]["CodeUri"].lstrip("./"), f"{name}: Code {code}")
        check(p.get("Runtime") == "provided.al2023" and p.get("Handler") == "bootstrap",
              f"{name}: runtime {p.get('Runtime')}, handler {p.get('Handler')}")
        check(p.get("Architectures") == [{"Ref": "Architecture"}], f"{name}: Architectures {p.get('Architectures')}")
        check(isinstance(p.get("Role"), dict) and "Fn::GetAtt" in p["Role"], f"{name}: Role {p.get('Role')}")

    urls = 0
    for name, fn in functions.items():
        url_config = fn["Properties"].get("FunctionUrlConfig")
        if not url_config:
            continue
        urls += 1
        url = [u for u in of_type("AWS::Lambda::Url").values() if targets(u["Properties"]["TargetFunctionArn"], name)]
        check(len(url) == 1, f"{name}: {len(url)} AWS::Lambda::Url")
        for u in url:
            check(u["Properties"].get("AuthType") == "NONE", f"{name}: URL AuthType {u['Properties'].get('AuthType')}")
            check(u["Properties"].get("InvokeMode") == "RESPONSE_STREAM",
                  f"{name}: URL InvokeMode {u['Properties'].get('InvokeMode')} (SSE needs RESPONSE_STREAM)")
        perms = [p["Properties"] for p in of_type("AWS::Lambda::Permission").values()
                 if targets(p["Properties"].get("FunctionName"), name)]
        check(any(p["Action"] == "lambda:InvokeFunctionUrl" and p.get("Principal") == "*"
                  and p.get("FunctionUrlAuthType") == "NONE" for p in perms),
              f"{name}: no public lambda:InvokeFunctionUrl permission")
        check(any(p["Action"] == "lambda:InvokeFunction" and p.get("Principal") == "*"
                  and p.get("InvokedViaFunctionUrl") is True for p in perms),
              f"{name}: no lambda:InvokeFunction permission through the URL (InvokedViaFunctionUrl)")
        check(not any(p["Action"] == "lambda:InvokeFunction" and p.get("Principal") == "*"
                      and p.get("InvokedViaFunctionUrl") is not True for p in perms),
              f"{name}: lambda:InvokeFunction for anyone, not only through its URL")
    check(urls > 0, "no function has a Function URL")

    for name, fn in functions.items():
        for ev_name, ev in (fn["Properties"].get("Events") or {}).items():
            if ev["Type"] == "SQS":
                m = [r["Properties"] for r in of_type("AWS::Lambda::EventSourceMapping").values()
                     if targets(r["Properties"]["FunctionName"], name)]
                check(len(m) == 1 and m[0].get("FunctionResponseTypes") == ["ReportBatchItemFailures"],
                      f"{name}.{ev_name}: event source mapping {m}")
            elif ev["Type"] == "Schedule":
                rules = [r for r in of_type("AWS::Events::Rule").values()
                         if any(targets(t.get("Arn"), name) for t in r["Properties"].get("Targets", []))]
                check(len(rules) == 1, f"{name}.{ev_name}: {len(rules)} EventBridge rules")
                perms = [p["Properties"] for p in of_type("AWS::Lambda::Permission").values()
                         if targets(p["Properties"].get("FunctionName"), name)
                         and p["Properties"].get("Principal") == "events.amazonaws.com"]
                check(len(perms) == 1, f"{name}.{ev_name}: {len(perms)} EventBridge invoke permissions")

    made_up = sorted(k for k, r in res.items() if r["Type"] in ("AWS::IAM::Role", "AWS::IAM::Policy")
                     and k not in sam["Resources"])
    check(not made_up, f"roles or policies the translator added: {made_up}")

    if failures:
        print("sam-transformed-check: the transformed template is wrong:", file=sys.stderr)
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    print(f"sam-transformed-check: {len(functions)} functions deploy their `make build` zips; "
          f"{urls} Function URLs public and streaming with both invoke permissions; event sources, schedules, roles ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
