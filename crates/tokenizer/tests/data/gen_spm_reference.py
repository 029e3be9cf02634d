# Regenerates spm_merges_reference.json: a SentencePiece-style vocabulary (char n-grams
# of the fixture corpus, scores with ties) and the merges transformers derives from it.
# Run from crates/tokenizer/.
import json, collections
from transformers.convert_slow_tokenizer import generate_merges
corpus=open('data/corpus.txt',encoding='utf-8').read()[:30000]
text='▁'+corpus.replace(' ','▁').replace('\n','▁')
cnt=collections.Counter()
for n in range(1,7):
    for i in range(len(text)-n):
        cnt[text[i:i+n]]+=1
pieces=[p for p,_ in cnt.most_common(1200)]
tokens=['<unk>','<s>','</s>']+pieces
scores=[0.0,0.0,0.0]+[-float(i//3) for i in range(len(pieces))]
vocab={t:i for i,t in enumerate(tokens)}
merges=generate_merges(vocab, dict(zip(tokens,scores)))
json.dump({'tokens':tokens,'scores':scores,'merges':[a+' '+b for a,b in merges]}, open('tests/data/spm_merges_reference.json','w'), ensure_ascii=False)
print(len(tokens), len(merges))
