# Regenerates expected.json (chat template renders by transformers/jinja2). Run from tests/data/.
import json, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
def raise_exception(m): raise TemplateError(m)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
from transformers.utils.chat_template_utils import _compile_jinja_template
convs = {
 'sys_user': [{'role':'system','content':'  You are helpful.  '},{'role':'user','content':'Hi  there!'}],
 'multi': [{'role':'user','content':'Hello'},{'role':'assistant','content':' Hi! How can I help? '},{'role':'user','content':'Tell me about café 日本語 🚀'}],
 'bad': [{'role':'user','content':'a'},{'role':'user','content':'b'}],
}
out={}
for name in ['chatml','llama3','llama2','blocks']:
    src=open(f'{name}.jinja').read()
    t=_compile_jinja_template(src)
    for cn,c in convs.items():
        for agp in [False, True]:
            try:
                r=t.render(messages=c, add_generation_prompt=agp, bos_token='<s>', eos_token='</s>', tools=None, documents=None)
            except Exception as e:
                r='ERROR: '+str(e)
            out[f'{name}/{cn}/{agp}']=r
json.dump(out, open('expected.json','w'), ensure_ascii=False, indent=1)
for k,v in out.items(): print(k, repr(v)[:300])
